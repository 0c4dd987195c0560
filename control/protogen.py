"""Generate the Python code of `protos/` into `prefill_gate/` (one command), or check it is current.

python -m control.protogen          # regenerate
python -m control.protogen --check  # exit 1 when the committed code differs from a fresh generation
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT
PACKAGE = Path("prefill_gate") / "v1"


def proto_files() -> list[Path]:
    """The .proto sources, relative to protos/."""
    return sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc (grpcio-tools) for every proto into `out_root`; returns the generated files."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    package = out_root / PACKAGE
    for init in (out_root / "prefill_gate" / "__init__.py", package / "__init__.py"):
        if not init.exists():
            init.write_text('"""Generated from protos/ by `python -m control.protogen`; do not edit."""\n')
    return sorted(package.glob("*_pb2*.py*"))


def stale_files() -> list[str]:
    """Generated files that differ from (or are missing next to) a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            committed = OUT_ROOT / PACKAGE / path.name
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(PACKAGE / path.name))
        names = {p.name for p in fresh}
        stale += [str(PACKAGE / p.name) for p in (OUT_ROOT / PACKAGE).glob("*_pb2*.py*") if p.name not in names]
        return stale


def main(argv: list[str] | None = None) -> int:
    """Command-line entry."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail when the generated code is stale")
    ns = parser.parse_args(argv)
    if ns.check:
        stale = stale_files()
        if stale:
            print("stale generated code (run `python -m control.protogen`):", *stale, sep="\n  ")
            return 1
        print("generated code is current")
        return 0
    for path in generate(OUT_ROOT):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
