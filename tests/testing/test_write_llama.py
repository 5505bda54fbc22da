"""trtattn/testing/write_llama.py: the Llama written straight to ONNX is the network transformers computes.

The tiny preset is checked against transformers' LlamaForCausalLM loaded with the initializers the
writer streamed to disk, the cache form against the padded form split into past + new steps, and
trtattn's matcher must find every attention with the right heads.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trtattn.testing import write_llama

TINY = write_llama.PRESETS["tiny"]
HEAD = TINY["hidden"] // TINY["heads"]
BATCH, SEQ = 2, 7
# fp16 graphs against float32 transformers on the same (fp16) weights: logits are ~N(0, 1)
ATOL = {"float32": 2e-4, "float16": 3e-2}


@pytest.fixture(scope="module")
def tiny_llama_path(tmp_path_factory):
    """The tiny model in each form and dtype, written once per module."""
    out = tmp_path_factory.mktemp("write_llama")
    cache = {}

    def get(form: str, dtype: str) -> Path:
        if (form, dtype) not in cache:
            cache[form, dtype] = write_llama.write_llama(out / f"tiny-{form}-{dtype}.onnx",
                                                         **{**TINY, "dtype": dtype, "form": form})
        return cache[form, dtype]

    return get


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _tokens_and_mask(seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TINY["vocab"], (BATCH, SEQ))
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, :2] = 0  # a left-padded row, as batched generation has
    positions = np.broadcast_to(np.arange(SEQ), (BATCH, SEQ)).copy()
    return ids, mask, positions


def _empty_past(dtype: str, n: int = 0) -> dict:
    shape = (BATCH, TINY["kv_heads"], n, HEAD)
    return {f"past_key_values.{i}.{part}": np.zeros(shape, dtype)
            for i in range(TINY["layers"]) for part in ("key", "value")}


def _transformers_logits(path: Path, ids, mask, positions) -> np.ndarray:
    """LlamaForCausalLM (eager attention, float32) with the ONNX model's initializers as its weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = onnx.load(path)  # reads the external data
    cfg = json.loads({p.key: p.value for p in model.metadata_props}["write_llama.config"])
    config = transformers.LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        max_position_embeddings=cfg["max_positions"], rope_theta=cfg["rope_theta"], rms_norm_eps=cfg["rms_eps"],
        tie_word_embeddings=False, attn_implementation="eager")
    state = {}
    for t in model.graph.initializer:
        a = onnx.numpy_helper.to_array(t).astype(np.float32)
        # projections are stored as the export stores them: [in, out], torch's Linear weight transposed
        state[t.name.removesuffix(".T")] = torch.from_numpy(np.ascontiguousarray(a.T if t.name.endswith(".T") else a))
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.load_state_dict(state, strict=True)
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                 position_ids=torch.from_numpy(positions), use_cache=False)
    return out.logits.numpy()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("form", ["padded", "cache"])
def test_written_model_is_valid_and_streamed(tiny_llama_path, form, dtype):
    path = tiny_llama_path(form, dtype)
    onnx.checker.check_model(str(path), full_check=True)  # by path: the external data is checked too
    model = onnx.load(path, load_external_data=False)
    data = path.with_name(path.name + ".data")
    expected = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}[dtype]
    for t in model.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        assert t.data_location == onnx.TensorProto.EXTERNAL and info["location"] == data.name, t.name
        assert int(info["offset"]) % write_llama.ALIGN == 0, t.name
        assert t.data_type == expected, t.name
    weights = {t.name: onnx.numpy_helper.to_array(t, base_dir=str(path.parent)) for t in model.graph.initializer}
    assert all(np.isfinite(w).all() for w in weights.values())
    norm = weights["model.layers.0.input_layernorm.weight"]
    assert 0.7 < norm.min() and norm.max() < 1.3 and norm.std() > 0.01  # near 1, not all ones
    q = weights["model.layers.0.self_attn.q_proj.weight.T"].astype(np.float64)
    assert q.shape == (TINY["hidden"], TINY["hidden"])
    assert abs(q.std() * TINY["hidden"] ** 0.5 - 1) < 0.1  # std 1/sqrt(fan_in)
    meta = json.loads({p.key: p.value for p in model.metadata_props}["trtattn.inputs"])
    names = [i.name for i in model.graph.input]
    assert list(meta["inputs"]) == names
    assert meta["inputs"]["input_ids"] == {"kind": "token_ids", "vocab": TINY["vocab"]}
    if form == "cache":
        assert names[3:7] == ["past_key_values.0.key", "past_key_values.0.value",
                              "past_key_values.1.key", "past_key_values.1.value"]
        assert [o.name for o in model.graph.output][1:3] == ["present.0.key", "present.0.value"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_padded_logits_equal_transformers(tiny_llama_path, dtype):
    path = tiny_llama_path("padded", dtype)
    ids, mask, positions = _tokens_and_mask()
    (logits,) = _session(path).run(["logits"], {"input_ids": ids, "attention_mask": mask, "position_ids": positions})
    assert logits.dtype == np.dtype(dtype) and logits.shape == (BATCH, SEQ, TINY["vocab"])
    expected = _transformers_logits(path, ids, mask, positions)
    assert expected.std() > 0.3  # logits that tell tokens apart, so the comparison means something
    # padding query rows attend to nothing: their softmax is over dtype-min logits (fp16 rounds those apart)
    valid = mask.astype(bool)
    np.testing.assert_allclose(logits[valid].astype(np.float32), expected[valid], atol=ATOL[dtype], rtol=0)
    if dtype == "float32":  # there the rows are uniform averages in both, so every position must match
        np.testing.assert_allclose(logits, expected, atol=ATOL[dtype], rtol=0)


def test_llama3_head_shape_equals_transformers(tmp_path):
    """Llama 3's per-head shape (head size 128, 4 query heads per KV head, RoPE theta 500000, eps 1e-5)."""
    cfg = {**write_llama.PRESETS["llama3-8b"], "layers": 1, "hidden": 512, "heads": 4, "kv_heads": 1, "ffn": 256,
           "vocab": 300, "dtype": "float32"}
    path = write_llama.write_llama(tmp_path / "llama3-head.onnx", **cfg)
    rng = np.random.default_rng(2)
    ids, mask = rng.integers(0, 300, (BATCH, SEQ)), np.ones((BATCH, SEQ), np.int64)
    positions = np.stack([np.arange(SEQ), np.arange(SEQ) + 3000])  # far positions: the low RoPE frequencies matter
    (logits,) = _session(path).run(["logits"], {"input_ids": ids, "attention_mask": mask, "position_ids": positions})
    np.testing.assert_allclose(logits, _transformers_logits(path, ids, mask, positions), atol=ATOL["float32"], rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cache_steps_equal_padded(tiny_llama_path, dtype):
    """Prefill 4 tokens on an empty cache, then 2, then 1 (decode): the padded form's logits."""
    ids, mask, positions = _tokens_and_mask(1)
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    (full,) = _session(tiny_llama_path("padded", dtype)).run(["logits"], feeds)
    step = _session(tiny_llama_path("cache", dtype))
    outputs = [o.name for o in step.get_outputs()]
    past, start = _empty_past(dtype), 0
    for end in (4, 6, 7):
        got = dict(zip(outputs, step.run(None, {"input_ids": ids[:, start:end], "attention_mask": mask[:, :end],
                                                "position_ids": positions[:, start:end], **past})))
        assert got["present.0.key"].shape == (BATCH, TINY["kv_heads"], end, HEAD)
        valid = mask[:, start:end].astype(bool)  # fully masked (padding) query rows differ by design
        np.testing.assert_allclose(got["logits"][valid].astype(np.float32),
                                   full[:, start:end][valid].astype(np.float32), atol=ATOL[dtype] / 4, rtol=0)
        past = {k: got[k.replace("past_key_values", "present")] for k in past}
        start = end


@pytest.mark.parametrize("form", ["padded", "cache"])
def test_trtattn_finds_every_attention(tiny_llama_path, form):
    from trtattn.match import match

    result = match(onnx.load(tiny_llama_path(form, "float16")))
    assert len(result.sites) == TINY["layers"] and not result.skipped
    for i, site in enumerate(result.sites):
        assert (site.q_heads, site.kv_heads, site.head_size) == (TINY["heads"], TINY["kv_heads"], HEAD)
        assert site.scale == pytest.approx(HEAD ** -0.5)
        assert site.rope is not None and site.rope.kind.value == "half_split"
        if form == "cache":
            assert site.cache.value == "concat" and site.past_key == f"past_key_values.{i}.key"


SITE_FIELDS = ("kind", "q_layout", "k_layout", "v_layout", "output_layout", "q_heads", "kv_heads", "head_size",
               "scale", "prescale", "scale_placement", "mask", "causal", "window", "padding", "cache", "logits_cast",
               "rank", "notes")


@pytest.mark.parametrize("form, zoo_name", [("padded", "llama"), ("cache", "llama-cache")])
def test_sites_are_those_of_the_real_export(tiny_llama_path, zoo_export, form, zoo_name):
    """The zoo's TorchScript export of the same shapes (LlamaModel: the head does not matter to attention)
    gives the same site records, field for field, tensor names aside."""
    from trtattn.match import match

    def records(path):
        sites = match(onnx.load(path)).sites
        return [({f: getattr(s, f) for f in SITE_FIELDS}, s.rope and (s.rope.kind, s.rope.rotary_dim),
                 [m.op for m in s.mask_steps]) for s in sites]

    mine, real = records(tiny_llama_path(form, "float32")), records(zoo_export(zoo_name, "torchscript"))
    assert len(mine) == TINY["layers"] and mine == real


def test_weights_do_not_depend_on_chunking_or_layer_count(tmp_path, monkeypatch):
    """Each tensor comes from its own (seed, name) generator: fewer layers or smaller chunks, same weights."""
    one = write_llama.write_llama(tmp_path / "one.onnx", **{**TINY, "layers": 1})
    monkeypatch.setattr(write_llama, "CHUNK", 100)  # our own module's knob: forces many chunks per tensor
    two = write_llama.write_llama(tmp_path / "two.onnx", **TINY)
    a, b = ({t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(p).graph.initializer} for p in (one, two))
    assert set(a) < set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_bad_shapes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="KV heads"):
        write_llama.write_llama(tmp_path / "m.onnx", **{**TINY, "kv_heads": 3})
    with pytest.raises(ValueError, match="form"):
        write_llama.write_llama(tmp_path / "m.onnx", **{**TINY, "form": "packed"})
    assert not list(tmp_path.iterdir())  # nothing half-written
