"""graph/dims.py with the ops' own dims (graph/op_dims.py): GenAI builder models fit at once, a cache-reading site
is checked at an empty and a non-empty past, and an empty past is a dim a user can give."""

import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import one_node_model
from trtattn.cli.dims import parse_dims
from trtattn.errors import TrtattnError
from trtattn.graph.dims import _empty_output, fit_dims
from trtattn.graph.feeds import make_feeds
from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder
from trtattn.testing.gqa_fusion_graphs import fused_rotary_gqa, unfused_rotary_gqa
from trtattn.verify.compare import default_feeds


@pytest.mark.parametrize("spec", [GenaiSpec(layers=1), GenaiSpec(layers=1, dtype="float16"),
                                  GenaiSpec(layers=1, norms="microsoft")], ids=["fp32", "fp16", "microsoft-norms"])
def test_genai_model_fits_at_the_first_try_with_a_prefill_beside(spec):
    fit = fit_dims(genai_decoder(spec))
    assert fit.runs == 1, fit.reasons
    assert (fit["kv_cache_dim"], fit["batch_size"]) == (16, 1)
    assert fit["total_sequence_length"] == fit["past_sequence_length"] + fit["sequence_length"]
    assert fit["past_sequence_length"] > 0 and fit["sequence_length"] > 1  # a step over a past, causal across queries
    [prefill] = fit.also
    assert (prefill["past_sequence_length"], prefill["batch_size"]) == (0, 2)
    assert prefill["total_sequence_length"] == prefill["sequence_length"]
    assert any("prefill" in r for r in fit.reasons)


def test_verification_feeds_cover_both_cache_lengths():
    model = genai_decoder(GenaiSpec(layers=1))
    feeds = default_feeds(model, dims=fit_dims(model))
    pasts = [f["past_key_values.0.key"].shape[2] for f in feeds]
    assert 0 in pasts and max(pasts) > 0
    for f in feeds:
        assert f["attention_mask"].shape[1] == f["past_key_values.0.key"].shape[2] + f["input_ids"].shape[1]


def test_an_empty_past_is_a_dim_the_user_gives():
    assert parse_dims("past_sequence_length=0,batch_size=2") == {"past_sequence_length": 0, "batch_size": 2}
    with pytest.raises(TrtattnError, match="at least 0"):
        parse_dims("past_sequence_length=-1")
    model = genai_decoder(GenaiSpec(layers=1))
    fit = fit_dims(model, {"past_sequence_length": 0})
    assert (fit["past_sequence_length"], fit["total_sequence_length"], fit["batch_size"]) == (0, 8, 2)
    assert not fit.also  # the user's past is theirs: nothing else is run
    feeds = make_feeds(model, dims=fit)
    assert feeds["past_key_values.0.key"].shape == (2, 2, 0, 16)


def test_a_user_batch_over_a_past_is_searched_from_and_the_head_size_is_not_guessed():
    """The user's batch 2 with several new tokens over a past: GQA on CPU refuses it, the search finds what runs."""
    fit = fit_dims(genai_decoder(GenaiSpec(layers=1)), {"batch_size": 2})
    assert fit["batch_size"] == 2 and fit["kv_cache_dim"] == 16
    assert fit["past_sequence_length"] == 0 or fit["sequence_length"] == 1, fit.reasons


@pytest.mark.parametrize("make", [lambda: fused_rotary_gqa(), lambda: fused_rotary_gqa(packed=True),
                                  unfused_rotary_gqa], ids=["fused", "fused-packed", "unfused"])
def test_onnxscript_style_gqa_models_fit(make):
    """Was: 'does not run at S=8, P=8, B=8, max_seqlen=8 (nor at 63 other dims tried)'."""
    fit = fit_dims(make())
    assert fit["B"] == 1 and fit["P"] > 0 and fit["max_seqlen"] >= fit["P"] + fit["S"], fit.reasons


# Survivors of mutating graph/dims.py (benchmarks/mutate.py, base 8bb4c20):
# each test pins an outcome the fast lane left open.
def test_an_empty_input_dim_is_chosen_not_an_empty_output():
    """A dim the graph names plainly (an empty past: past = 0) is an input's, chosen; only an expression of
    the input dims below 1 (past - 1) says the run would give an empty output."""
    def model(out_dim: str) -> onnx.ModelProto:
        return one_node_model("Identity", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "past"])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_dim])])
    assert not _empty_output(model("past"), {"past": 0})
    assert _empty_output(model("past - 1"), {"past": 1})
    assert not _empty_output(model("past - 1"), {"past": 2})
