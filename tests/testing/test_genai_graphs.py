"""The hand-built GenAI decoders run on ONNX Runtime CPU at a prefill (empty past) and at decode steps, and a decode
step after a prefill gives the logits the longer prefill gives (the cache is carried right)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder, genai_feeds, write_genai_folder

SPECS = [GenaiSpec(), GenaiSpec(dtype="float16"), GenaiSpec(norms="microsoft"), GenaiSpec(static_head_dim=True)]


def _session(spec: GenaiSpec) -> ort.InferenceSession:
    return ort.InferenceSession(genai_decoder(spec).SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}-{s.norms}-{'static' if s.static_head_dim else 'kv'}")
def test_runs_at_prefill_and_decode(spec):
    session = _session(spec)
    for batch, new, past in ((2, 8, 0), (1, 1, 7), (2, 1, 7), (1, 4, 5)):
        logits, key, *_ = session.run(None, genai_feeds(spec, batch=batch, new=new, past=past))
        assert logits.shape == (batch, new, spec.vocab) and logits.dtype == spec.np_dtype
        assert key.shape == (batch, spec.kv_heads, past + new, spec.head_size)
        assert np.isfinite(logits).all()


def test_decode_continues_the_prefill():
    spec = GenaiSpec()
    session = _session(spec)
    feeds = genai_feeds(spec, batch=1, new=8)
    full = session.run(None, feeds)[0]
    head = session.run(None, {**feeds, "input_ids": feeds["input_ids"][:, :7], "attention_mask": feeds["attention_mask"][:, :7]})
    step = {"input_ids": feeds["input_ids"][:, 7:], "attention_mask": feeds["attention_mask"],
            **{f"past_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}": v for i, v in enumerate(head[1:])}}
    np.testing.assert_allclose(session.run(None, step)[0][:, 0], full[:, 7], atol=1e-4)


def test_a_batch_with_a_past_and_new_tokens_is_refused_on_cpu():
    """The kernel's rule the dims search has to follow: batch 1 when several new tokens meet a past."""
    spec = GenaiSpec()
    with pytest.raises(Exception, match="batch_size must be 1"):
        _session(spec).run(None, genai_feeds(spec, batch=2, new=4, past=5))


def test_strict_onnx_accepts_the_plain_decoder():
    onnx.checker.check_model(genai_decoder(GenaiSpec()), full_check=True)


def test_folder_has_the_builders_config(tmp_path):
    spec = GenaiSpec(head_size=8, kv_heads=1, context_length=64)
    folder = write_genai_folder(tmp_path / "m", spec)
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert (decoder["head_size"], decoder["num_key_value_heads"], config["model"]["context_length"]) == (8, 1, 64)
    model = onnx.load(folder / "model.onnx")
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    width = next(i for i in model.graph.initializer if i.name.endswith("qkv_proj.weight")).dims[1]
    assert width == (spec.heads + 2 * spec.kv_heads) * 8 and gqa.input[7] == "cos_cache"
