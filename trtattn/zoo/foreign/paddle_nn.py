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


class Recognizer(paddle.nn.Layer):
    """A text recogniser's attention (PaddleOCR SVTR's mixing block): a conv stem takes a 32-high line image to a
    height of 1 and its width to a quarter; Q, K, V come from one projection reshaped to [0, n, 3, heads, size],
    n read off the input's shape (a Concat-computed shape), and Q is scaled by paddle's scale op (Mul, Add 0)."""

    def __init__(self):
        super().__init__()
        nn = paddle.nn
        self.stem = nn.Sequential(nn.Conv2D(3, 16, 3, stride=2, padding=1), nn.BatchNorm2D(16), nn.ReLU(),
                                  nn.Conv2D(16, WIDTH, 3, stride=2, padding=1), nn.BatchNorm2D(WIDTH), nn.ReLU(),
                                  nn.Conv2D(WIDTH, WIDTH, (8, 1)))  # height 32 -> 8 -> 1: runs at a height of 32 only
        self.norm, self.qkv, self.proj = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.scale = (WIDTH // HEADS) ** -0.5

    def forward(self, image):
        x = self.stem(image).squeeze(2).transpose([0, 2, 1])  # [N, W/4, C]
        n, c = paddle.shape(x)[1], x.shape[2]
        qkv = self.qkv(self.norm(x)).reshape([0, n, 3, HEADS, c // HEADS]).transpose([2, 0, 3, 1, 4])
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = paddle.nn.functional.softmax(q.matmul(k.transpose([0, 1, 3, 2])), axis=-1)
        return x + self.proj(attn.matmul(v).transpose([0, 2, 1, 3]).reshape([0, n, c]))


def specs():
    return [paddle.static.InputSpec([None, None, WIDTH], "float32", "x"), paddle.static.InputSpec([None, None], "int64", "mask")]


def image_specs():
    return [paddle.static.InputSpec([None, 3, None, None], "float32", "image")]


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
    for opset, suffix in ((17, ""), (7, "-opset7")):
        paddle.seed(2)
        yield Recognizer(), f"paddle-recognizer{suffix}.paddle2onnx.onnx", opset, 1, \
            f"text-recogniser-style attention (SVTR's mixing block) on [N, 3, ?, ?] images, opset {opset}: runs only " \
            "at a height of 32; Q/K/V from one projection reshaped by a Concat-computed shape", \
            ["paddle2onnx", "dims_search", "dynamic_dimension_names", "concat_shape_reshape"] + (["opset7"] if opset == 7 else [])


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for layer, name, opset, sites, source, exercises in recipes():
        path = _export(layer, image_specs() if isinstance(layer, Recognizer) else specs(), out, name, opset)
        print(json.dumps({"file": path.name, "exporter": "paddle2onnx", "exporter_version": paddle2onnx.__version__,
                          "framework": f"paddlepaddle {paddle.__version__}", "source": source,
                          "expected_sites": sites, "exercises": exercises}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
