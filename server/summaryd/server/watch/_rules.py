"""The watch's rules and their thresholds: useful defaults, tuned by a small file (`--watch-rules FILE`), TOML,
or YAML when its name ends in `.yaml` or `.yml` (read with PyYAML: `pip install 'summaryd[yaml]'`).

The file has one table (mapping) per rule, each key optional; `runs` (shell-style patterns, default every run)
says which runs a rule watches:

    [silence]
    after_secs = 0        # 0: derived from each worker's own cadence
    [divergence]
    tags = ["*loss*"]
    ratio = 4.0
    runs = ["prod/*"]
"""

from __future__ import annotations

import dataclasses
import fnmatch
import tomllib
from dataclasses import dataclass, field
from typing import Any

RULES = ("silence", "nonfinite", "divergence", "straggler")


@dataclass(frozen=True)
class SilenceRule:
    """A worker that sent `min_batches` has sent none for `after_secs`, or (0) for `factor` times its longest
    interval between batches (of its last 32, and of its pauses in the last 10-20 minutes: a checkpoint's pause is
    learnt once) plus `grace_secs`; while its session is open, or for `lost_secs` after the daemon released it
    (its client stopped answering)."""

    enabled: bool = True
    after_secs: float = 0.0
    factor: float = 2.0
    grace_secs: float = 3.0
    min_batches: int = 5
    lost_secs: float = 600.0
    runs: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class NonFiniteRule:
    """A scalar of a tag matching `tags` is NaN or ±inf; resolved after `resolve_points` finite points of it
    from every rank that logged a non-finite one."""

    enabled: bool = True
    tags: tuple[str, ...] = ("*",)
    resolve_points: int = 3
    runs: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class DivergenceRule:
    """A tag matching `tags` stays, for `for_points` points in a row, above the lower of `ratio` times the minimum
    of its last `window` points (when that minimum is positive) and their median plus `spike_mads` robust
    deviations (1.4826 x the median absolute deviation); resolved after `resolve_points` points below halfway
    back to the median. The baseline needs `warmup` points and is frozen while the finding fires; a series is
    watched once it has fallen (the median of its window's newest quarter under its oldest quarter's), so that a
    value that only ever rose is not taken for a loss that diverged."""

    enabled: bool = True
    tags: tuple[str, ...] = ("*loss*",)
    ratio: float = 4.0
    spike_mads: float = 10.0
    window: int = 128
    warmup: int = 20
    for_points: int = 3
    resolve_points: int = 5
    runs: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class StragglerRule:
    """A rank whose step time (wall time over steps, across its last 32 batches) is `factor` times the median of
    the other ranks' for `for_secs`; resolved once under `resolve_factor` for `for_secs`. Needs `min_workers`."""

    enabled: bool = True
    factor: float = 1.5
    resolve_factor: float = 1.2
    for_secs: float = 10.0
    min_workers: int = 2
    runs: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class Rules:
    """Every rule's settings, and the watch's bounds: runs watched, and series (rank, tag) kept for divergence
    over all runs (the points of further series are not watched for divergence; counted)."""

    silence: SilenceRule = field(default_factory=SilenceRule)
    nonfinite: NonFiniteRule = field(default_factory=NonFiniteRule)
    divergence: DivergenceRule = field(default_factory=DivergenceRule)
    straggler: StragglerRule = field(default_factory=StragglerRule)
    max_runs: int = 1024
    max_series: int = 10_000

    @classmethod
    def load(cls, path: str, silent_after: float = 0.0) -> Rules:
        """The rules of file `path` (TOML, or YAML by its name; defaults when `path` is ""); `silent_after`
        (`--silent-after`) overrides `silence.after_secs` when positive.

        Raises:
            ValueError: the file cannot be read or parsed, or names a rule, key or value it cannot take.
        """
        data: dict[str, Any] = {}
        if path:
            try:
                with open(path, "rb") as file:
                    text = file.read()
            except OSError as exc:
                raise ValueError(f"--watch-rules {path}: {exc.strerror or exc}") from None
            data = _yaml(text, path) if path.endswith((".yaml", ".yml")) else _toml(text, path)
        rules = cls._from(data, f"--watch-rules {path}")
        if silent_after < 0:
            raise ValueError("--silent-after must be 0 (derived from each worker's cadence) or positive")
        if silent_after:
            rules = dataclasses.replace(rules, silence=dataclasses.replace(rules.silence, after_secs=silent_after))
        return rules

    @classmethod
    def _from(cls, data: dict[str, Any], where: str) -> Rules:
        values: dict[str, Any] = {}
        kinds = {f.name: f for f in dataclasses.fields(cls)}
        for name, given in data.items():
            if name not in kinds:
                raise ValueError(f"{where}: no rule or setting {name!r}; use {', '.join(kinds)}")
            default = getattr(cls(), name)
            if dataclasses.is_dataclass(default):
                if not isinstance(given, dict):
                    raise ValueError(f"{where}: [{name}] must be a table")
                values[name] = _rule(type(default), given, f"{where}: [{name}]")
            elif isinstance(given, int) and not isinstance(given, bool) and given > 0:
                values[name] = given
            else:
                raise ValueError(f"{where}: {name} must be a positive integer")
        return cls(**values)

    def applies(self, rule: str, run: str) -> bool:
        """Whether `rule` is on and watches `run`."""
        settings = getattr(self, rule)
        return bool(settings.enabled) and any(fnmatch.fnmatchcase(run, p) for p in settings.runs)


def _toml(text: bytes, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"--watch-rules {path}: not TOML: {exc}") from None


def _yaml(text: bytes, path: str) -> dict[str, Any]:
    try:
        import yaml  # type: ignore[import-untyped]  # pyyaml (the `yaml` extra); no stubs
    except ImportError:
        raise ValueError(
            f"--watch-rules {path}: a YAML file needs PyYAML (pip install 'summaryd[yaml]'); or write it as TOML"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"--watch-rules {path}: not YAML: {' '.join(str(exc).split())}") from None
    if data is None:  # an empty file: the defaults
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--watch-rules {path}: a YAML file of rules is a mapping of rule names to settings")
    return data


def _rule(kind: type[Any], given: dict[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(kind)}
    values: dict[str, Any] = {}
    for key, value in given.items():
        f = fields.get(key)
        if f is None:
            raise ValueError(f"{where}: no setting {key!r}; use {', '.join(fields)}")
        default = getattr(kind(), key)
        if isinstance(default, tuple):
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise ValueError(f'{where}: {key} must be a list of patterns, e.g. ["*loss*"]')
            values[key] = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{where}: {key} must be true or false")
            values[key] = value
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {key} must be a positive integer")
            values[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{where}: {key} must be a number, 0 or more")
            values[key] = float(value)
    rule = kind(**values)
    if getattr(rule, "factor", 2.0) <= 1.0 or getattr(rule, "ratio", 2.0) <= 1.0:
        raise ValueError(f"{where}: factor and ratio must be above 1")
    if kind is StragglerRule and not 1.0 <= rule.resolve_factor <= rule.factor:
        raise ValueError(f"{where}: resolve_factor must lie between 1 and factor")
    return rule
