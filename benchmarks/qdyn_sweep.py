#!/usr/bin/env python
"""Dynamically quantized encoders through `fuse` (issue 34): 10-layer BERT (hidden 512) and SpeechT5 (hidden 384)
encoders, random weights from their configs, exported by TorchScript, then onnxruntime.quantization.quantize_dynamic
at its 8 settings (per_channel x reduce_range x QInt8/QUInt8); each fused with verification, one row per setting.

    python benchmarks/qdyn_sweep.py [--models bert,speecht5] [--work-dir out/qdyn] [--json FILE]

Needs torch and transformers (the `export` extra). Columns: sites fused of sites, the worst site's own error against
its bound (each site run on the original's inputs: verify/requant.py), the output's error and its widened bound.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

LAYERS = 10


def _bert():
    import transformers

    config = transformers.BertConfig(num_hidden_layers=LAYERS, hidden_size=512, num_attention_heads=8,
                                     intermediate_size=1024, vocab_size=100)
    bert = transformers.BertModel(config).eval()

    def forward(input_ids, attention_mask):
        return bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return bert, forward, "input_ids"


def _speecht5():
    import transformers
    from transformers.models.speecht5.modeling_speecht5 import SpeechT5EncoderWithoutPrenet

    config = transformers.SpeechT5Config(hidden_size=384, encoder_layers=LAYERS, encoder_attention_heads=6,
                                         encoder_ffn_dim=1536, vocab_size=100)
    encoder = SpeechT5EncoderWithoutPrenet(config).eval()

    def forward(hidden_states, attention_mask):
        return encoder(input_values=hidden_states, attention_mask=attention_mask).last_hidden_state

    return encoder, forward, "hidden_states"


MODELS = {"bert": _bert, "speecht5": _speecht5}


def export(name: str, out: Path) -> Path:
    """The fp32 encoder of `name`, exported once to `out` (reused)."""
    import torch

    path = out / f"{name}.onnx"
    if path.exists():
        return path
    torch.manual_seed(0)
    module, forward, first = MODELS[name]()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x, attention_mask):
            return forward(x, attention_mask)

    x = torch.randint(0, 100, (1, 16)) if first == "input_ids" else torch.randn(1, 16, 384)
    mask = torch.ones(1, 16, dtype=torch.long)
    axes = {first: {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    out.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(Encoder().eval(), (x, mask), path, input_names=list(axes), output_names=["last_hidden_state"],
                      dynamic_axes=axes, opset_version=17, dynamo=False)
    return path


def quantized(src: Path, per_channel: bool, reduce_range: bool, weight: str) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = src.with_name(f"{src.stem}.{'pc' if per_channel else 'pt'}.{'rr' if reduce_range else 'full'}.{weight}.onnx")
    if not path.exists():
        quantize_dynamic(src, path, per_channel=per_channel, reduce_range=reduce_range,
                         weight_type=getattr(QuantType, weight), op_types_to_quantize=["MatMul", "Gemm"])
    return path


def row(name: str, path: Path, setting: dict) -> dict:
    import onnx

    from trtattn.rewrite.fuse import fuse_model

    model = onnx.load(path)
    start = time.perf_counter()
    result = fuse_model(model)
    v = result.verification
    sites = [(r.max_abs_err or 0.0, v.bounds.get(r.site.output, v.atol), r.status.value) for r in result.reports]
    worst = max(sites, key=lambda s: s[0] / s[1] if s[1] else 0.0, default=(0.0, 0.0, ""))
    out = model.graph.output[0].name
    return {"model": name, **setting, "fused": sum(s[2] == "fused" for s in sites), "sites": len(sites),
            "ok": result.ok, "worst_site_error": worst[0], "worst_site_bound": worst[1],
            "output_error": (v.outputs or {}).get(out), "output_bound": (v.bounds or {}).get(out),
            "why": v.tolerance_why or "", "seconds": round(time.perf_counter() - start, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,speecht5")
    parser.add_argument("--work-dir", default="out/qdyn")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows = []
    print("| model | per_channel | reduce_range | weights | fused | worst site error / bound | output error / bound |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        src = export(name, Path(args.work_dir))
        for per_channel, reduce_range, weight in itertools.product((False, True), (False, True), ("QInt8", "QUInt8")):
            setting = {"per_channel": per_channel, "reduce_range": reduce_range, "weights": weight}
            r = row(name, quantized(src, per_channel, reduce_range, weight), setting)
            rows.append(r)
            print(f"| {name} | {per_channel} | {reduce_range} | {weight} | {r['fused']}/{r['sites']} | "
                  f"{r['worst_site_error']:.3g} / {r['worst_site_bound']:.3g} | "
                  f"{r['output_error'] or 0:.3g} / {r['output_bound'] or 0:.3g} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
