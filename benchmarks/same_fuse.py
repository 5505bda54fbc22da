#!/usr/bin/env python
"""What a verified fuse decides, per model, to compare two checkouts: a speed change must remove no check.

    PYTHONPATH=CHECKOUT python benchmarks/same_fuse.py OUT.json MODEL.onnx|DIR ...
    python benchmarks/same_fuse.py --diff BEFORE.json AFTER.json

Each model is fused with verification in this process (as `trtattn fuse` does: weights left on disk) and
recorded: every site's report row, the verification (every max abs error, the dims it ran at), the notes, and
the sha256 of the written model's bytes. `--diff` prints each model whose record differs and exits 1 if any does.
A DIR stands for its *.onnx files and its */model.onnx (fusion_coverage.py's exports).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def _models(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for a in map(Path, args):
        out += sorted([*a.glob("*.onnx"), *a.glob("*/model.onnx")]) if a.is_dir() else [a]
    return out


def record(path: Path) -> dict:
    from trtattn.graph import io
    from trtattn.rewrite.fuse import fuse_model

    try:
        result = fuse_model(io.load(path, load_external_data=False), verify=True)
    except Exception as e:  # a model refused is a record too: the same refusal before and after
        return {"error": f"{type(e).__name__}: {e}"}
    return {"reports": [r.row() for r in result.reports], "verification": result.verification.to_json(),
            "notes": list(result.notes), "dims": result.dims,
            "model_sha256": hashlib.sha256(result.model.SerializeToString(deterministic=True)).hexdigest()}


def diff(before: dict, after: dict) -> int:
    changed = [name for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
    for name in changed:
        print(f"{name}: differs\n  before: {json.dumps(before.get(name))[:600]}\n  after:  {json.dumps(after.get(name))[:600]}")
    print(f"{len(before)} before, {len(after)} after, {len(changed)} differ")
    return 1 if changed else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--diff"]:
        return diff(*(json.loads(Path(p).read_text()) for p in argv[1:3]))
    records = {}
    for path in _models(argv[1:]):
        records[str(path)] = record(path)
        print(path, "error" if "error" in records[str(path)] else "ok", flush=True)
    Path(argv[0]).write_text(json.dumps(records, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
