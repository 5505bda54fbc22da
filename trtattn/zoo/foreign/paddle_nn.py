"""paddle2onnx exports of paddle.nn attention (run in a venv with `.[foreign-paddle]`).

A stand-alone script: it imports only paddle, paddle2onnx and onnx, writes its files into OUT_DIR and
prints one JSON manifest row per file (make.py collects them). Random weights, seeded.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import paddle
import paddle2onnx

WIDTH, HEADS = 32, 4


def _export(layer, specs, out: Path, name: str, opset: int) -> Path:
    layer.eval()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "model")
        static = paddle.jit.to_static(layer, input_spec=specs, full_graph=True)
        paddle.jit.save(static, prefix)
        model_file = next(p for p in Path(tmp).iterdir() if p.name.startswith("model.") and p.suffix in (".json", ".pdmodel"))
        paddle2onnx.export(str(model_file), prefix + ".pdiparams", str(out / name), opset_version=opset)
    return out / name


class MHA(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.attn = paddle.nn.MultiHeadAttention(WIDTH, HEADS)

    def forward(self, x, mask):
        # paddle's attn_mask: [B, 1, 1, S] additive (or bool); a 0/1 padding mask made additive here
        bias = (1.0 - paddle.cast(mask, "float32")).unsqueeze([1, 2]) * -1e4
        return self.attn(x, x, x, attn_mask=bias)


class Encoder(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        layer = paddle.nn.TransformerEncoderLayer(WIDTH, HEADS, 64, dropout=0.0)
        self.encoder = paddle.nn.TransformerEncoder(layer, 2)

    def forward(self, x, mask):
        keep = paddle.cast(mask, "bool").unsqueeze([1, 2])  # True = attend
        return self.encoder(x, src_mask=keep)


def specs():
    return [paddle.static.InputSpec([None, None, WIDTH], "float32", "x"), paddle.static.InputSpec([None, None], "int64", "mask")]


def recipes():
    paddle.seed(0)
    yield MHA(), "paddle-mha.paddle2onnx.onnx", 17, 1, \
        "paddle.nn.MultiHeadAttention, additive padding mask", ["paddle2onnx"]
    paddle.seed(1)
    yield Encoder(), "paddle-encoder.paddle2onnx.onnx", 17, 2, \
        "paddle.nn.TransformerEncoder (2 layers), boolean padding mask", ["paddle2onnx", "boolean_mask"]
    paddle.seed(0)
    yield MHA(), "paddle-mha-opset7.paddle2onnx.onnx", 7, 1, \
        "paddle.nn.MultiHeadAttention exported at opset 7", ["paddle2onnx", "opset7", "flatten_softmax"]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for layer, name, opset, sites, source, exercises in recipes():
        path = _export(layer, specs(), out, name, opset)
        print(json.dumps({"file": path.name, "exporter": "paddle2onnx", "exporter_version": paddle2onnx.__version__,
                          "framework": f"paddlepaddle {paddle.__version__}", "source": source,
                          "expected_sites": sites, "exercises": exercises}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
