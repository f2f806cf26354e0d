"""The committed generated modules match what `scripts/gen_protos.py` produces from the `.proto`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)], check=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert generated, "the generator produced nothing"
    for rel in generated:
        committed = ROOT / "proto" / rel
        assert committed.exists(), f"{rel} is not committed; run scripts/gen_protos.py"
        assert committed.read_text() == (tmp_path / rel).read_text(), (
            f"proto/{rel} is out of date; run `python scripts/gen_protos.py` and commit the result"
        )
