"""DESIGN.md states the delivery guarantees in one table, and each row points at the tests that show it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The faults the delivery guarantees cover, each of which the table must answer.
FAULTS = {
    "daemon sigkilled": r"daemon sigkilled",
    "daemon down": r"daemon down for the whole run",
    "daemon hangs": r"daemon hangs",
    "disk full": r"disk full",
    "client sigkilled": r"client sigkilled",
    "sigterm and exit": r"client sigterm, or exit",
    "fork": r"fork",
    "overflow": r"outruns",
    "flood": r"flood",
    "power loss": r"power loss",
}


def guarantees_table() -> list[list[str]]:
    text = (ROOT / "DESIGN.md").read_text()
    section = text.split("## Delivery guarantees", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows[0].lower().startswith("| fault | what survives | how | shown by |"), rows[0]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_design_states_what_survives_which_fault() -> None:
    rows = guarantees_table()
    faults = [row[0].lower() for row in rows]
    for name, pattern in FAULTS.items():
        assert any(re.search(pattern, fault) for fault in faults), f"the guarantees table has no row for {name}"
    for fault, survives, how, shown_by in rows:
        assert survives and how, f"row {fault!r} says too little"
        for module in re.findall(r"`(test_\w+)`", shown_by):
            assert (ROOT / "tests" / f"{module}.py").is_file(), f"row {fault!r} cites a missing {module}"
        assert re.search(r"`test_\w+`", shown_by) or "not tested" in shown_by, f"row {fault!r} cites no test"
