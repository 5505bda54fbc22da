"""Regenerate the foreign-export corpus (tests/data/foreign/) and its manifest.

    python -m trtattn.zoo.foreign.make [--out tests/data/foreign] [--tf PY] [--paddle PY] [--jax PY] [--only FILE ...]

The tool-derived files (fp16 conversion, onnxsim, onnxslim, ORT optimizer and quantize_dynamic, function
inlining, low opsets) are made here from zoo exports. The tf2onnx, paddle2onnx and jax2onnx files come
from stand-alone scripts run with another environment's Python (--tf/--paddle/--jax, or the
TRTATTN_FOREIGN_TF/_PADDLE/_JAX variables): tensorflow, paddle and jax pin numpy and protobuf
differently from this project, so each lives in its own venv (pyproject extras foreign-tf,
foreign-paddle, foreign-jax; the pins are in trtattn/zoo/foreign/README.md). An exporter whose Python is
not given keeps its manifest rows and files as they are. --only FILE ...: remake just the named files (a
tool-derived file, or one a given --tf/--paddle/--jax script writes); every other row and file stays.
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


def run_script(kind: str, python: str, out: Path, only: set[str] | None = None) -> list[dict]:
    """The script's files copied into `out` (those named in `only`, when given) and their manifest rows."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([python, str(HERE / SCRIPTS[kind]), tmp], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{SCRIPTS[kind]} failed with {python}:\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        rows = [r for r in rows if only is None or r["file"] in only]
        for row in rows:
            (out / row["file"]).write_bytes((Path(tmp) / row["file"]).read_bytes())
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT)
    for kind in SCRIPTS:
        p.add_argument(f"--{kind}", default=os.environ.get(f"TRTATTN_FOREIGN_{kind.upper()}"),
                       help=f"the Python of a venv with the foreign-{kind} extra")
    p.add_argument("--skip-tools", action="store_true", help="do not remake the tool-derived files")
    p.add_argument("--only", nargs="+", metavar="FILE",
                   help="remake only these files (their manifest rows replaced, the others kept)")
    args = p.parse_args(argv)
    if args.only:  # what cannot be made is refused before anything runs (a script's names are checked after)
        from .tools import RECIPES

        if args.skip_tools and set(args.only) & set(RECIPES):
            p.error(f"--only {' '.join(sorted(set(args.only) & set(RECIPES)))}: tool-derived, and --skip-tools is given")
        if not any(getattr(args, kind) for kind in SCRIPTS) and set(args.only) - set(RECIPES):
            p.error(f"--only {' '.join(sorted(set(args.only) - set(RECIPES)))}: not a tool-derived file, and no "
                    "--tf/--paddle/--jax Python is given to make it")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    only = set(args.only) if args.only else None
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / MANIFEST.name
    rows = {r["file"]: r for r in (load_manifest(manifest_path) if manifest_path.exists() else [])}
    made: list[dict] = []
    if not args.skip_tools:
        from .tools import RECIPES, make

        if only is None or only & set(RECIPES):
            made += make(args.out, sorted(only & set(RECIPES)) if only else None)
    for kind in SCRIPTS:
        python = getattr(args, kind)
        if python:
            made += run_script(kind, python, args.out, only)
    missing = sorted(only - {r["file"] for r in made}) if only else []
    if missing:
        raise SystemExit(f"--only {' '.join(missing)}: no recipe or script made it (the manifest is left as it was)")
    rows.update({r["file"]: r for r in made})
    for name in rows:
        size = (args.out / name).stat().st_size
        if size > MAX_FILE:
            raise SystemExit(f"{name} is {size} bytes: corpus files stay under {MAX_FILE}")
    manifest_path.write_text(json.dumps(sorted(rows.values(), key=lambda r: r["file"]), indent=1) + "\n")
    print(f"{len(rows)} files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
