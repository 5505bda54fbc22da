"""tf2onnx exports of Keras and plain TensorFlow attention (run in a venv with `.[foreign-tf]`).

A stand-alone script: it imports only tensorflow, tf2onnx and onnx, writes its files into OUT_DIR
and prints one JSON manifest row per file (make.py collects them). Random weights, seeded.
tensorflow and tf2onnx are imported when a recipe runs, so the module (RECIPES: the files it writes)
imports in the project's environment, which has neither.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

WIDTH, HEADS, KEY_DIM = 32, 4, 8
TOKENS = 17  # the ViT's: 16 patches and a class token
OPSET = 17


def tensorflow():
    """(tensorflow, tf2onnx), or a one-line exit saying where they are installed."""
    try:
        import tensorflow as tf
        import tf2onnx
    except ImportError as e:
        raise SystemExit(f"tf_keras.py: {e}; run it with the Python of a venv with the foreign-tf extra "
                         "(trtattn/zoo/foreign/README.md)") from None
    return tf, tf2onnx


def _save(fn, specs, path: Path, opset: int = OPSET) -> Path:
    _, tf2onnx = tensorflow()
    tf2onnx.convert.from_function(fn, input_signature=specs, opset=opset, output_path=str(path))
    return path


def keras_mha(path: Path):
    tf, _ = tensorflow()
    tf.keras.utils.set_random_seed(0)
    layer = tf.keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM)
    x = tf.keras.Input((None, WIDTH))
    layer(x, x)  # build

    @tf.function
    def fn(x):
        return layer(x, x)

    _save(fn, [tf.TensorSpec([None, None, WIDTH], tf.float32, name="x")], path)
    return 1, "keras.layers.MultiHeadAttention (self attention, no mask)", ["einsum_layout", "tf2onnx"]


def keras_block(path: Path):
    """A pre-built Keras transformer encoder block with a padding mask: MHA + LayerNorm + FFN."""
    tf, _ = tensorflow()
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
    _save(fn, specs, path)
    return 1, "Keras encoder block: MultiHeadAttention with a [B, 1, S] padding mask, LayerNorm, FFN", \
        ["einsum_layout", "multiplicative_mask", "mask_after_softmax", "tf2onnx"]


def tf_plain(path: Path):
    """Hand-written TF attention: tf.matmul products, a 0/1 mask multiplied in then offset."""
    tf, _ = tensorflow()
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
    _save(fn, specs, path)
    return 1, "plain TF attention: tf.matmul, logits * mask - 1e4 * (1 - mask), tf.nn.softmax", \
        ["multiplicative_mask", "tf2onnx"]


def keras_vit(path: Path):
    """A ViT-style Keras encoder on 16x16 images: 4x4 patches, a class token, 17 tokens (a static length) and a
    symbolic batch (tf2onnx names it unk__N). Without attention dropout Keras calls ops.dot_product_attention,
    whose einsums tf2onnx lowers with shape arithmetic that shape inference names unk__N along the length too."""
    tf, _ = tensorflow()
    tf.keras.utils.set_random_seed(3)
    layers, rng = tf.keras.layers, np.random.default_rng(3)
    patch = layers.Conv2D(WIDTH, 4, strides=4)
    cls = tf.Variable(rng.standard_normal((1, 1, WIDTH)).astype(np.float32) * 0.2)
    pos = tf.Variable(rng.standard_normal((1, TOKENS, WIDTH)).astype(np.float32) * 0.2)
    gelu = layers.Activation(lambda t: tf.keras.activations.gelu(t, approximate=True))  # tf2onnx has no Erfc
    blocks = [(layers.LayerNormalization(), layers.MultiHeadAttention(HEADS, KEY_DIM),
               layers.LayerNormalization(), tf.keras.Sequential([layers.Dense(64), gelu, layers.Dense(WIDTH)]))
              for _ in range(2)]

    def encoder(image):
        x = patch(image)
        b = tf.shape(x)[0]
        x = tf.concat([tf.tile(cls, [b, 1, 1]), tf.reshape(x, [b, TOKENS - 1, WIDTH])], axis=1) + pos
        for norm1, mha, norm2, mlp in blocks:
            h = norm1(x)
            x = x + mha(h, h)
            x = x + mlp(norm2(x))
        return x

    encoder(tf.zeros([2, 16, 16, 3]))  # build the layers
    _save(tf.function(encoder), [tf.TensorSpec([None, 16, 16, 3], tf.float32, name="image")], path)
    return 2, "Keras ViT-style encoder (2 blocks): 17 tokens, a static length, with a symbolic batch (unk__N)", \
        ["einsum_layout", "static_length_symbolic_batch", "tf2onnx"]


def keras_mha_mask(path: Path):
    """Keras MultiHeadAttention with a [B, T, S] boolean attention mask and attention dropout (with dropout Keras
    computes the scores itself; at inference dropout is the identity): Keras' masked softmax,
    where(mask, logits, -1e9) then where(mask, P, 0), which tf2onnx lowers as
    Add(Mul(Cast(mask), P), Mul(0, Cast(Not(mask)))) on the probabilities."""
    tf, _ = tensorflow()
    tf.keras.utils.set_random_seed(5)
    mha = tf.keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM, dropout=0.1)

    def attend(x, mask):
        keep = tf.cast(mask, tf.bool)
        return mha(x, x, attention_mask=keep[:, None, :] & keep[:, :, None])

    attend(tf.zeros([2, 5, WIDTH]), tf.ones([2, 5], tf.int32))  # build the layer
    specs = [tf.TensorSpec([None, None, WIDTH], tf.float32, name="x"), tf.TensorSpec([None, None], tf.int32, name="mask")]
    _save(tf.function(attend), specs, path)
    return 1, "keras.layers.MultiHeadAttention with a [B, T, S] padding mask: Keras' masked softmax, " \
        "SelectV2(mask, P, 0) after the softmax", ["einsum_layout", "mask_after_softmax", "select_after_softmax", "tf2onnx"]


RECIPES = {"keras-mha.tf2onnx.onnx": keras_mha, "keras-block.tf2onnx.onnx": keras_block,
           "tf-plain.tf2onnx.onnx": tf_plain, "keras-vit.tf2onnx.onnx": keras_vit,
           "keras-mha-mask.tf2onnx.onnx": keras_mha_mask}


def main(out: Path) -> None:
    tf, tf2onnx = tensorflow()
    out.mkdir(parents=True, exist_ok=True)
    for name, recipe in RECIPES.items():
        sites, source, exercises = recipe(out / name)
        print(json.dumps({"file": name, "exporter": "tf2onnx", "exporter_version": tf2onnx.__version__,
                          "framework": f"tensorflow {tf.__version__}, keras {tf.keras.__version__}",
                          "source": source, "expected_sites": sites, "exercises": exercises}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
