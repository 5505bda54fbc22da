"""Scale: Llama-shaped decoders written by trtattn/testing/write_llama.py (the graph TorchScript writes for
LlamaForCausalLM, seeded random weights in one external-data file), no torch export needed.

- per-layer cost: the same small shape at 2, 4, 8, 16 and 32 layers (time per added layer should be flat);
- large models: the 2.2 GB fp32 `llama-2gb` preset and, with --8b, Llama-3-8B's shapes in fp16 (16 GB of
  weights), each tool once, its output deleted as soon as it is measured (and the 8B model itself at the
  end unless --keep-8b: it is 15 GB on disk).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .bench import Bench, ort_kwargs

SCALING_SHAPE = dict(hidden=256, heads=4, kv_heads=2, ffn=512, vocab=512, max_positions=128, dtype="float32")
SCALING_LAYERS = (2, 4, 8, 16, 32)
QUICK_SCALING_LAYERS = (2, 8)
LARGE = ("llama-2gb",)
HUGE = "llama3-8b"


def _write_llama():
    from trtattn.testing import write_llama

    return write_llama


def written(bench: Bench, name: str, config: dict) -> Path:
    """trtattn/testing/write_llama.py's model for `config` in the work dir, written once (kept while the config and
    the script are unchanged)."""
    folder = bench.work / "models" / name
    path, meta = folder / "model.onnx", folder / "write.json"
    wl = _write_llama()
    key = {"config": config, "script": Path(wl.__file__).stat().st_mtime}
    if path.exists() and meta.exists() and json.loads(meta.read_text()) == key:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    bench.say(f"  writing {name} with write_llama.py ...")
    wl.write_llama(path, **config)
    meta.write_text(json.dumps(key))
    return path


def _kwargs(config: dict) -> dict:
    return ort_kwargs("llama", {"num_attention_heads": config["heads"], "hidden_size": config["hidden"]})


def scaling(bench: Bench, layers) -> list[dict]:
    rows = []
    for n in layers:
        config = {**SCALING_SHAPE, "layers": n}
        path = written(bench, f"llama-{n}L", config)
        row = bench.row(f"llama-{n}L", "write_llama", path, "llama", n, _kwargs(config), check=False)
        row["layers"] = n
        rows.append(row)
    return rows


def large(bench: Bench, huge: bool = False, keep_huge: bool = False) -> list[dict]:
    wl = _write_llama()
    rows = []
    for name in LARGE + ((HUGE,) if huge else ()):
        config = dict(wl.PRESETS[name])
        path = written(bench, name, config)
        try:
            row = bench.row(name, "write_llama", path, "llama", config["layers"], _kwargs(config), check=False,
                            repeat=1, keep=False)  # one run per tool: minutes each; outputs deleted at once
        finally:
            if name == HUGE and not keep_huge:
                shutil.rmtree(path.parent)
        rows.append(row)
    return rows
