"""Regenerate the Python code for proto/ (messages, gRPC stubs, typed stubs).

Usage: ``python scripts/gen_protos.py`` rewrites ``clients/ferryman/v1/``;
``python scripts/gen_protos.py --check`` regenerates into a temporary directory
and exits 1 if the committed files differ (CI's drift check).

The proto package ``ferryman.v1`` maps onto the Python package
``ferryman.v1`` under ``clients/``, so generated imports need no rewriting.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_ROOT = ROOT / "clients"
GEN_PACKAGE = Path("ferryman") / "v1"
INIT_TEXT = '"""Generated protobuf and gRPC code for ferryman.v1 (do not edit)."""\n'


def generate(out_root: Path) -> None:
    """Run protoc (from grpcio-tools) with the mypy-protobuf plugins into out_root."""
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    bin_dir = Path(sys.executable).parent
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    (out_root / GEN_PACKAGE / "__init__.py").write_text(INIT_TEXT)


def _generated_files(root: Path) -> list[Path]:
    pkg = root / GEN_PACKAGE
    return sorted(p.relative_to(pkg) for p in pkg.glob("*") if p.is_file())


def check() -> int:
    """Return 0 when the committed generated code matches a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = Path(tmp)
        (tmp_root / GEN_PACKAGE).mkdir(parents=True)
        generate(tmp_root)
        fresh = _generated_files(tmp_root)
        committed = _generated_files(OUT_ROOT)
        drift = sorted(set(fresh) ^ set(committed))
        drift += [
            f
            for f in fresh
            if f in committed and not filecmp.cmp(tmp_root / GEN_PACKAGE / f, OUT_ROOT / GEN_PACKAGE / f, shallow=False)
        ]
    if drift:
        print("generated code is stale; run: python scripts/gen_protos.py", file=sys.stderr)
        for f in drift:
            print(f"  {GEN_PACKAGE / f}", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    args = parser.parse_args()
    if args.check:
        return check()
    pkg = OUT_ROOT / GEN_PACKAGE
    for old in pkg.glob("*_pb2*"):
        old.unlink()
    pkg.mkdir(parents=True, exist_ok=True)
    generate(OUT_ROOT)
    shutil.rmtree(pkg / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
