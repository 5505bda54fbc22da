"""jax2onnx exports of flax attention (run in a venv with `.[foreign-jax]`).

A stand-alone script: it imports only jax, flax, jax2onnx and onnx, writes its files into OUT_DIR and
prints one JSON manifest row per file (make.py collects them). Random weights, seeded.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from jax2onnx import to_onnx

WIDTH, HEADS = 32, 4


def mha():
    layer = nnx.MultiHeadAttention(num_heads=HEADS, in_features=WIDTH, qkv_features=WIDTH, decode=False,
                                   rngs=nnx.Rngs(0))

    def fn(x):
        return layer(x)

    return fn, [("B", "S", WIDTH)], "flax-mha.jax2onnx.onnx", 1, "flax.nnx.MultiHeadAttention (self attention, no mask)", \
        ["jax2onnx", "einsum_layout"]


def mha_masked():
    layer = nnx.MultiHeadAttention(num_heads=HEADS, in_features=WIDTH, qkv_features=WIDTH, decode=False,
                                   rngs=nnx.Rngs(1))

    def fn(x, mask):
        keep = nnx.make_attention_mask(mask > 0, mask > 0)  # [B, 1, S, S]
        return layer(x, mask=keep)

    return fn, [("B", "S", WIDTH), jax.ShapeDtypeStruct(("B", "S"), jnp.int32)], "flax-mha-mask.jax2onnx.onnx", 1, \
        "flax.nnx.MultiHeadAttention with a padding mask from nnx.make_attention_mask", \
        ["jax2onnx", "einsum_layout", "boolean_mask", "mask_after_softmax"]


def recipes():
    yield mha()
    yield mha_masked()


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for fn, inputs, name, sites, source, exercises in recipes():
        to_onnx(fn, inputs, model_name=name.split(".")[0], opset=21, output_path=str(out / name), return_mode="file")
        print(json.dumps({"file": name, "exporter": "jax2onnx", "exporter_version": version("jax2onnx"),
                          "framework": f"jax {jax.__version__}, flax {version('flax')}", "source": source,
                          "expected_sites": sites, "exercises": exercises}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
