"""Issue 34's "done when" on GenAI builder folders, as a user runs the commands (no --dims): one row per folder.

    .venv-genai/bin/python benchmarks/genai_matrix.py ROOT [--out OUT] [--trtattn-python .venv/bin/python]

ROOT holds the folders `python -m trtattn.testing.genai_builds ROOT` writes (FAMILY-PRECISION, each with a
genai_config.json). For each folder, in its own subprocess as a user would run them:
- `fuse DIR/model.onnx`: exit code, and the dims verified (the searched ones and `also_verified_at`);
- `fuse DIR`: exit code, then ONNX Runtime GenAI's greedy tokens from the fused folder against the original's;
- `fuse DIR/model.onnx --ops trt`: exit code (0 only when the plugins' check passed);
- `build DIR/model.onnx --plan-json`: exit code (4 without TensorRT), IAttention sites, KV-cache updates and the
  cache capacity the plan takes.
Prints a markdown table. Needs onnxruntime-genai (README: the GenAI environment) for the tokens; the commands
run in --trtattn-python's environment (the main one, with the quant extra's ModelOpt), this one's by default.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from trtattn.testing import genai_builds

PYTHON = [sys.executable]


def trtattn(*args: str) -> tuple[int, str]:
    done = subprocess.run([*PYTHON, "-m", "trtattn", *args], capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr).strip()


def last_line(text: str) -> str:
    """The line that says why: the error, else the last line that is not progress."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("[trtattn]")]
    said = [line for line in lines if "error" in line.lower()] or lines
    return said[-1][:200] if said else ""


def fuse_model(folder: Path, out: Path) -> str:
    report = out / "model.json"
    rc, text = trtattn("fuse", str(folder / "model.onnx"), "-o", str(out / "model.onnx"), "--report", str(report))
    if rc != 0:
        return f"exit {rc}: {last_line(text)}"
    dims = json.loads(report.read_text()).get("dims", {})
    return f"exit 0, verified at {len(dims.get('also_verified_at', [])) + 1} dims sets"


def fuse_folder(folder: Path, out: Path) -> str:
    rc, text = trtattn("fuse", str(folder), "-o", str(out / "folder"))
    if rc != 0:
        return f"exit {rc}: {last_line(text)}"
    original = genai_builds.greedy_tokens(folder)
    try:
        fused = genai_builds.greedy_tokens(out / "folder")
    except RuntimeError as e:  # ONNX Runtime GenAI's own refusal of the fused folder
        return f"exit 0, GenAI fails: {str(e).splitlines()[0][:160]}"
    same = sum(a == b for a, b in zip(original, fused))
    search = json.loads((out / "folder" / "genai_config.json").read_text()).get("search", {})
    buffer = "shared buffer kept" if search.get("past_present_share_buffer") else "buffer unshared"
    return f"exit 0, tokens {same}/{len(original)} equal, {buffer}"


def fuse_trt(folder: Path, out: Path) -> str:
    rc, text = trtattn("fuse", str(folder / "model.onnx"), "--ops", "trt", "-o", str(out / "trt.onnx"))
    return "exit 0" if rc == 0 else f"exit {rc}: {last_line(text)}"


def build(folder: Path, out: Path) -> str:
    plan_json = out / "plan.json"
    rc, text = trtattn("build", str(folder / "model.onnx"), "--out-dir", str(out / "engines"),
                       "--plan-json", str(plan_json))
    if not plan_json.exists():
        return f"exit {rc}: {last_line(text)}"
    plan = json.loads(plan_json.read_text())
    sites = plan.get("sites", [])
    caches = text.count("-> TRT_KVCacheUpdate")
    capacity = next((line.split("cache capacity")[-1].strip() for line in text.splitlines()
                     if "cache capacity" in line), "?")
    return f"exit {rc}, {len(sites)} IAttention, {caches} KV-cache updates, capacity {capacity}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, default=Path("genai-matrix"))
    parser.add_argument("--trtattn-python", default=sys.executable, help="the Python that runs trtattn's commands")
    args = parser.parse_args(argv)
    PYTHON[:] = [args.trtattn_python]
    folders = sorted(p.parent for p in args.root.glob("*/genai_config.json"))
    print("| folder | fuse model | fuse DIR (GenAI tokens) | fuse --ops trt | build |")
    print("|---|---|---|---|---|")
    for folder in folders:
        out = args.out / folder.name
        out.mkdir(parents=True, exist_ok=True)
        cells = [step(folder, out) for step in (fuse_model, fuse_folder, fuse_trt, build)]
        print(f"| {folder.name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
