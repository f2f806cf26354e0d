"""Resident memory of a process from `/proc/<pid>/status`: now, and the peak since it was last reset.

Writing `5` to `/proc/<pid>/clear_refs` resets the peak (`VmHWM`) to the current size (Linux 4.0+, needs the
right to write there: the process itself, or root), so a phase's peak is measured apart from what came before.
"""

from __future__ import annotations

import contextlib


def _status_kib(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size now, in MiB."""
    return _status_kib(pid, "VmRSS") / 1024


def peak_mb(pid: int | str = "self") -> float:
    """The largest resident set size since the last `reset_peak` (or since the process started), in MiB."""
    return _status_kib(pid, "VmHWM") / 1024


def reset_peak(pid: int | str = "self") -> bool:
    """Start a new peak at the current size; False where the kernel does not allow it (the peak then is the
    process's lifetime peak, which overstates a phase's)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
        return True
    return False
