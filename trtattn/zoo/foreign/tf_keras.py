"""tf2onnx exports of Keras and plain TensorFlow attention (run in a venv with `.[foreign-tf]`).

A stand-alone script: it imports only tensorflow, tf2onnx and onnx, writes its files into OUT_DIR
and prints one JSON manifest row per file (make.py collects them). Random weights, seeded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf2onnx

WIDTH, HEADS, KEY_DIM = 32, 4, 8
OPSET = 17


def _save(fn, specs, out: Path, name: str, opset: int = OPSET) -> Path:
    path = out / name
    tf2onnx.convert.from_function(fn, input_signature=specs, opset=opset, output_path=str(path))
    return path


def keras_mha(out: Path):
    tf.keras.utils.set_random_seed(0)
    layer = tf.keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM)
    x = tf.keras.Input((None, WIDTH))
    layer(x, x)  # build

    @tf.function
    def fn(x):
        return layer(x, x)

    path = _save(fn, [tf.TensorSpec([None, None, WIDTH], tf.float32, name="x")], out, "keras-mha.tf2onnx.onnx")
    return path, 1, "keras.layers.MultiHeadAttention (self attention, no mask)", ["einsum_layout", "tf2onnx"]


def keras_block(out: Path):
    """A pre-built Keras transformer encoder block with a padding mask: MHA + LayerNorm + FFN."""
    tf.keras.utils.set_random_seed(1)
    mha = tf.keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM)
    norm1, norm2 = tf.keras.layers.LayerNormalization(), tf.keras.layers.LayerNormalization()
    ffn = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(WIDTH)])

    def block(x, mask):
        keep = tf.cast(mask[:, None, :], tf.bool)
        h = norm1(x + mha(x, x, attention_mask=keep))
        return norm2(h + ffn(h))

    block(tf.zeros([2, 5, WIDTH]), tf.ones([2, 5], tf.int32))  # build the layers
    fn = tf.function(block)

    specs = [tf.TensorSpec([None, None, WIDTH], tf.float32, name="x"), tf.TensorSpec([None, None], tf.int32, name="mask")]
    path = _save(fn, specs, out, "keras-block.tf2onnx.onnx")
    return path, 1, "Keras encoder block: MultiHeadAttention with a [B, 1, S] padding mask, LayerNorm, FFN", \
        ["einsum_layout", "multiplicative_mask", "mask_after_softmax", "tf2onnx"]


def tf_plain(out: Path):
    """Hand-written TF attention: tf.matmul products, a 0/1 mask multiplied in then offset."""
    rng = np.random.default_rng(2)
    # variables: tf2onnx freezes them into initializers (captured tensors would become graph inputs)
    wq, wk, wv, wo = (tf.Variable(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.2) for _ in range(4))

    def heads(t):
        b, s = tf.shape(t)[0], tf.shape(t)[1]
        return tf.transpose(tf.reshape(t, [b, s, HEADS, KEY_DIM]), [0, 2, 1, 3])

    @tf.function
    def fn(x, mask):
        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        logits = tf.matmul(q, k, transpose_b=True) / tf.math.sqrt(float(KEY_DIM))
        m = tf.cast(mask[:, None, None, :], tf.float32)
        logits = logits * m - 1e4 * (1.0 - m)
        p = tf.nn.softmax(logits, axis=-1)
        y = tf.transpose(tf.matmul(p, v), [0, 2, 1, 3])
        b, s = tf.shape(x)[0], tf.shape(x)[1]
        return tf.reshape(y, [b, s, WIDTH]) @ wo

    specs = [tf.TensorSpec([None, None, WIDTH], tf.float32, name="x"), tf.TensorSpec([None, None], tf.int32, name="mask")]
    path = _save(fn, specs, out, "tf-plain.tf2onnx.onnx")
    return path, 1, "plain TF attention: tf.matmul, logits * mask - 1e4 * (1 - mask), tf.nn.softmax", \
        ["multiplicative_mask", "tf2onnx"]


RECIPES = [keras_mha, keras_block, tf_plain]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for recipe in RECIPES:
        path, sites, source, exercises = recipe(out)
        print(json.dumps({"file": path.name, "exporter": "tf2onnx", "exporter_version": tf2onnx.__version__,
                          "framework": f"tensorflow {tf.__version__}, keras {tf.keras.__version__}",
                          "source": source, "expected_sites": sites, "exercises": exercises}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
