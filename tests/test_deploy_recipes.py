"""The deployment recipes of the relay topology (deploy/) stay true: every `summaryd` flag and `SUMMARYD_*`
variable they use is one the real CLI's `--help` shows (`summaryd serve --help` for the daemons and relays;
`summaryd health --help`, the client's variables, for what the ranks are given), the Kubernetes manifests
parse and wire relays to owners that exist, probe the daemon's gRPC health on the port it listens on, and give
the drain longer than the shutdown timeout; the shell scripts parse (`bash -n`), and so does the systemd unit.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # pyyaml, in the test extra; no stubs

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
SCRIPTS = sorted((DEPLOY / "slurm").glob("*.sh"))
UNIT = DEPLOY / "systemd" / "summaryd-relay.service"
RELAY_ENV = DEPLOY / "slurm" / "relay.env"

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_VARIABLE = re.compile(r"\bSUMMARYD_[A-Z0-9_]+\b")


@cache
def _help(command: str) -> str:
    cli = shutil.which("summaryd", path=str(Path(sys.executable).parent)) or shutil.which("summaryd")
    assert cli, "the summaryd command is missing: install the package (pip install -e .)"
    result = subprocess.run([cli, command, "--help"], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _serve_flags() -> set[str]:
    return set(_FLAG.findall(_help("serve")))


def _serve_variables() -> set[str]:
    return set(_VARIABLE.findall(_help("serve")))


def _client_variables() -> set[str]:
    return set(_VARIABLE.findall(_help("health")))


def _unknown_flags(flags: list[str]) -> list[str]:
    return sorted(set(flags) - _serve_flags())


def _unknown_variables(names: set[str], known: set[str]) -> list[str]:
    return sorted(names - known)


# ---- Kubernetes --------------------------------------------------------------------------------------------


def _documents() -> list[dict[str, Any]]:
    docs = [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert all("apiVersion" in doc and "kind" in doc and doc["metadata"]["name"] for doc in docs)
    return docs


def _workloads(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in _documents() if doc["kind"] == kind]


def _containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in _documents():
        if doc["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["image"].split("/")[-1].startswith("summaryd"):
                    yield doc, container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: str(item.get("value", "")) for item in container.get("env", [])}


def _args(container: dict[str, Any]) -> list[str]:
    """The image's entrypoint is `summaryd serve`: the container's args are its flags."""
    assert "command" not in container, "the recipes keep the image's entrypoint (summaryd serve)"
    return [str(arg) for arg in container.get("args", [])]


def test_the_manifests_hold_relays_owners_and_their_services() -> None:
    kinds = [doc["kind"] for doc in _documents()]
    assert "DaemonSet" in kinds and ("StatefulSet" in kinds or "Deployment" in kinds) and "Service" in kinds
    services = [doc for doc in _documents() if doc["kind"] == "Service"]
    for doc, _ in _containers():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
        selected = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        assert selected, f"no Service selects the pods of {doc['metadata']['name']}"


def test_the_manifests_use_only_flags_and_variables_summaryd_serve_has() -> None:
    for doc, container in _containers():
        where = f"{doc['metadata']['name']}/{container['name']}"
        assert not (flags := _unknown_flags(_FLAG.findall(" ".join(_args(container))))), (where, flags)
        variables = _unknown_variables(set(_VARIABLE.findall(" ".join(_env(container)))), _serve_variables())
        assert not variables, (where, variables)
    # What the manifests' comments tell a rank to set: the client's variables.
    comments = " ".join(line for path in MANIFESTS for line in path.read_text().splitlines() if "#" in line)
    told = set(_VARIABLE.findall(comments)) - _serve_variables()
    assert not (variables := _unknown_variables(told, _client_variables())), variables


def _flag_value(args: list[str], flag: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == flag:
            return args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _owner_addresses() -> set[str]:
    """The stable names of the owners' pods: `<statefulset>-<n>.<service>:<port>`."""
    out = set()
    for owners in _workloads("StatefulSet"):
        spec = owners["spec"]
        (container,) = spec["template"]["spec"]["containers"]
        port = _env(container)["SUMMARYD_LISTEN"].rsplit(":", 1)[1]
        out |= {f"{owners['metadata']['name']}-{n}.{spec['serviceName']}:{port}" for n in range(spec["replicas"])}
    return out


def test_relays_forward_to_the_owners_that_exist_and_owners_name_each_other() -> None:
    owners = _owner_addresses()
    assert owners
    for relay in _workloads("DaemonSet"):
        (container,) = relay["spec"]["template"]["spec"]["containers"]
        upstream = _flag_value(_args(container), "--upstream") or _env(container).get("SUMMARYD_UPSTREAM")
        assert upstream, "a relay needs --upstream"
        assert set(upstream.split(",")) == owners
    for doc in _workloads("StatefulSet"):
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        env = _env(container)
        if doc["spec"]["replicas"] > 1:  # several owners share a bucket: each names all as peers
            assert env["SUMMARYD_LOGDIR"].startswith(("s3://", "gs://", "az://"))
            assert set(env["SUMMARYD_PEERS"].split(",")) == owners
            assert env["SUMMARYD_ADVERTISE"] == f"$(POD_NAME).{doc['spec']['serviceName']}:6065"
    headless = {doc["spec"]["serviceName"] for doc in _workloads("StatefulSet")}
    services = {doc["metadata"]["name"]: doc for doc in _documents() if doc["kind"] == "Service"}
    assert all(services[name]["spec"]["clusterIP"] == "None" for name in headless)


def test_probes_ask_grpc_health_on_the_listening_port_and_the_drain_has_time() -> None:
    for doc, container in _containers():
        port = int(_env(container)["SUMMARYD_LISTEN"].rsplit(":", 1)[1])
        assert port in {p["containerPort"] for p in container["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == port, (doc["metadata"]["name"], probe)
        shutdown = float(_env(container).get("SUMMARYD_SHUTDOWN_TIMEOUT", "10"))
        assert doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > shutdown


# ---- SLURM and systemd -------------------------------------------------------------------------------------


def _logical_lines(text: str) -> list[str]:
    """Lines with their backslash continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _serve_invocations(lines: list[str]) -> list[list[str]]:
    """The words after `serve` of each line that runs `summaryd serve` (the program named directly or by a
    variable that holds its path)."""
    out = []
    for line in lines:
        words = shlex.split(line, posix=True)
        for index, word in enumerate(words[:-1]):
            if re.search(r"summaryd\"?$|\$SUMMARYD\"?$|\$\{SUMMARYD\}", word) and words[index + 1] == "serve":
                out.append(words[index + 2 :])
    return out


def _relay_env() -> dict[str, str]:
    pairs = [line.split("=", 1) for line in _logical_lines(RELAY_ENV.read_text())]
    assert all(len(pair) == 2 and re.fullmatch(r"[A-Z_][A-Z0-9_]*", pair[0]) for pair in pairs)
    return dict(pairs)  # type: ignore[arg-type]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_slurm_scripts_parse_and_use_only_what_summaryd_has(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    for words in _serve_invocations(_logical_lines(text)):
        flags = _unknown_flags([w.split("=", 1)[0] for w in words if w.startswith("--")])
        assert not flags, (script.name, flags)
    known = _serve_variables() | _client_variables()
    assert not (variables := _unknown_variables(set(_VARIABLE.findall(text)), known)), (script.name, variables)


def test_the_prolog_starts_a_relay_the_task_prolog_points_ranks_at_and_the_epilog_drains_it() -> None:
    prolog, task, epilog = (DEPLOY / "slurm" / name for name in ("prolog.sh", "task_prolog.sh", "epilog.sh"))
    (serve,) = _serve_invocations(_logical_lines(prolog.read_text()))
    port_file = _flag_value(serve, "--port-file")
    assert _flag_value(serve, "--listen") == "127.0.0.1:0" and port_file
    assert "SUMMARYD_UPSTREAM" in _relay_env(), "the relay's upstream comes from relay.env"
    assert port_file == "$port_file" and 'port_file="$RUN_DIR/relay-$job.port"' in prolog.read_text()
    assert "/run/summaryd/relay-${SLURM_JOB_ID}.port" in task.read_text()
    assert "RUN_DIR=/run/summaryd" in prolog.read_text()
    assert "export SUMMARYD_ADDRESS=" in task.read_text()
    assert "kill -TERM" in epilog.read_text() and "relay-$job.pid" in epilog.read_text()


def test_relay_env_sets_only_variables_summaryd_serve_has() -> None:
    assert not (variables := _unknown_variables(set(_relay_env()), _serve_variables())), variables


def _unit() -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in _logical_lines(UNIT.read_text()):
        if line.startswith("["):
            assert line.endswith("]"), line
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"not a key=value line in a section: {line!r}"
        key, value = line.split("=", 1)
        current[key.strip()] = value.strip()
    return sections


def test_the_systemd_unit_parses_and_runs_a_relay_summaryd_serve_knows() -> None:
    unit = _unit()
    assert {"Unit", "Service", "Install"} <= unit.keys()
    service = unit["Service"]
    words = shlex.split(service["ExecStart"])
    assert words[0].startswith("/") and words[0].endswith("/summaryd") and words[1] == "serve"
    assert not (flags := _unknown_flags([w.split("=", 1)[0] for w in words[2:] if w.startswith("--")])), flags
    known = _serve_variables() | _client_variables()
    assert not (variables := _unknown_variables(set(_VARIABLE.findall(UNIT.read_text())), known)), variables
    # The relay's settings are relay.env's, which says where it is installed.
    assert service["EnvironmentFile"] == "/etc/summaryd/relay.env"
    assert service["EnvironmentFile"] in RELAY_ENV.read_text()
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > float(_relay_env()["SUMMARYD_SHUTDOWN_TIMEOUT"])
