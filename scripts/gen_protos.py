"""Regenerate the committed protobuf and gRPC modules from `proto/summaryd/v1/*.proto`.

Usage: `python scripts/gen_protos.py [--out DIR]`. Without `--out` the modules are written beside their
`.proto` files; the drift test writes them to a temporary folder and compares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"


def generate(out: Path) -> list[Path]:
    """Generate `*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` for every proto into `out`."""
    protos = sorted(PROTO_ROOT.glob("summaryd/**/*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    for proto in protos:
        rel = proto.relative_to(PROTO_ROOT)
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                str(rel),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {rel} with exit code {code}")
    return sorted(p for p in out.rglob("*_pb2*.py*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in generate(args.out):
        print(path.relative_to(args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
