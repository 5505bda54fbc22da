"""Regenerate the foreign-export corpus (tests/data/foreign/) and its manifest.

    python -m trtattn.zoo.foreign.make [--out tests/data/foreign] [--tf PY] [--paddle PY] [--jax PY] [--only FILE ...]

The tool-derived files (fp16 conversion, onnxsim, onnxslim, ORT optimizer and quantize_dynamic, function
inlining, low opsets) are made here from zoo exports. The tf2onnx, paddle2onnx and jax2onnx files come
from stand-alone scripts run with another environment's Python (--tf/--paddle/--jax, or the
TRTATTN_FOREIGN_TF/_PADDLE/_JAX variables): tensorflow, paddle and jax pin numpy and protobuf
differently from this project, so each lives in its own venv (pyproject extras foreign-tf,
foreign-paddle, foreign-jax; the pins are in trtattn/zoo/foreign/README.md). An exporter whose Python is
not given keeps its manifest rows and files as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from . import MANIFEST, ROOT, load_manifest

SCRIPTS = {"tf": "tf_keras.py", "paddle": "paddle_nn.py", "jax": "flax_nnx.py"}
HERE = Path(__file__).parent
MAX_FILE = 2 * 1024 * 1024


def run_script(kind: str, python: str, out: Path) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([python, str(HERE / SCRIPTS[kind]), tmp], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{SCRIPTS[kind]} failed with {python}:\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        for row in rows:
            (out / row["file"]).write_bytes((Path(tmp) / row["file"]).read_bytes())
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT)
    for kind in SCRIPTS:
        p.add_argument(f"--{kind}", default=os.environ.get(f"TRTATTN_FOREIGN_{kind.upper()}"),
                       help=f"the Python of a venv with the foreign-{kind} extra")
    p.add_argument("--skip-tools", action="store_true", help="do not remake the tool-derived files")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / MANIFEST.name
    rows = {r["file"]: r for r in (load_manifest(manifest_path) if manifest_path.exists() else [])}
    if not args.skip_tools:
        from .tools import make

        rows.update({r["file"]: r for r in make(args.out)})
    for kind in SCRIPTS:
        python = getattr(args, kind)
        if python:
            rows.update({r["file"]: r for r in run_script(kind, python, args.out)})
    for name in rows:
        size = (args.out / name).stat().st_size
        if size > MAX_FILE:
            raise SystemExit(f"{name} is {size} bytes: corpus files stay under {MAX_FILE}")
    manifest_path.write_text(json.dumps(sorted(rows.values(), key=lambda r: r["file"]), indent=1) + "\n")
    print(f"{len(rows)} files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
