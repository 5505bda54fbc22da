"""graph/op_dims.py: the dims a model's attention ops fix, read from their attributes, the weights' shapes and the
folder's config, before any search."""

import onnx
import pytest

from trtattn.errors import TrtattnError
from trtattn.graph.op_dims import ConfigSizes, op_dims
from trtattn.testing.contrib_graphs import cache_model, group_query_decoder
from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder
from trtattn.testing.gqa_fusion_graphs import fused_rotary_gqa, unfused_rotary_gqa


@pytest.mark.parametrize("heads,kv_heads,head", [(4, 2, 16), (6, 1, 8), (2, 2, 32)])
def test_packed_qkv_width_gives_the_cache_head_size(heads, kv_heads, head):
    """(num_heads + 2 * kv_num_heads) * head_size is the packed width: the cache's symbolic last dim is its head size."""
    ops = op_dims(genai_decoder(GenaiSpec(heads=heads, kv_heads=kv_heads, head_size=head, hidden=32, layers=1)))
    assert ops.fixed["kv_cache_dim"].value == head
    assert f"({heads} + 2 * {kv_heads})" in ops.fixed["kv_cache_dim"].why and "GroupQueryAttention" in ops.fixed[
        "kv_cache_dim"].why


def test_total_is_past_plus_new_from_the_masks_shape():
    """GenAI's builder computes total_sequence_length as Shape(attention_mask)[1]: that dim is past + new, said once
    however many layers read it."""
    ops = op_dims(genai_decoder(GenaiSpec(layers=2)))
    assert [(s.total, s.parts) for s in ops.sums] == [("total_sequence_length", ("past_sequence_length",
                                                                                 "sequence_length"))]
    assert ops.apply({"past_sequence_length": 0, "sequence_length": 5}) == {
        "past_sequence_length": 0, "sequence_length": 5, "total_sequence_length": 5, "kv_cache_dim": 16}
    assert ops.limits["total_sequence_length"].value == GenaiSpec().context_length  # the rotary cache's rows


def test_batch_one_over_a_past_and_a_prefill_at_any_batch():
    ops = op_dims(genai_decoder(GenaiSpec(layers=1)))
    decode = ops.decode({"batch_size": 2, "past_sequence_length": 6, "sequence_length": 8}, {})
    assert decode["batch_size"] == 1 and decode["total_sequence_length"] == 14
    assert ops.decode({"batch_size": 2, "past_sequence_length": 6, "sequence_length": 1}, {})["batch_size"] == 2
    assert ops.decode({"batch_size": 2, "past_sequence_length": 6, "sequence_length": 8}, {"batch_size": 2})[
        "batch_size"] == 2  # the user's batch is theirs
    prefill = ops.prefill(decode, {}, {"batch_size": 2})
    assert (prefill["past_sequence_length"], prefill["batch_size"], prefill["total_sequence_length"]) == (0, 2, 8)
    assert ops.prefill(decode, {"past_sequence_length": 3}, {"batch_size": 2}) is None


def test_a_user_dim_the_op_fixes_otherwise_is_refused_naming_the_op():
    ops = op_dims(genai_decoder(GenaiSpec(layers=1)))
    ops.check_user({"kv_cache_dim": 16})
    with pytest.raises(TrtattnError, match="kv_cache_dim=8: GroupQueryAttention '.*' reads a head size of 16"):
        ops.check_user({"kv_cache_dim": 8})


def test_weights_give_the_width_where_no_shape_is_written():
    """The query's width from its projection's weight (no value_info in the model)."""
    model = genai_decoder(GenaiSpec(layers=1))
    assert not model.graph.value_info
    assert op_dims(model).fixed["kv_cache_dim"].value == 16


def test_config_gives_the_head_size_the_ops_leave_unknown():
    """A query whose width nothing says (a graph input of symbolic width): genai_config.json's head_size decides."""
    model = genai_decoder(GenaiSpec(layers=1))
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    gqa.input[0] = "qkv_in"
    model.graph.input.append(onnx.helper.make_tensor_value_info("qkv_in", onnx.TensorProto.FLOAT,
                                                                ["batch_size", "sequence_length", "width"]))
    assert "kv_cache_dim" not in op_dims(model).fixed
    fixed = op_dims(model, ConfigSizes("genai_config.json", head_size=16)).fixed["kv_cache_dim"]
    assert fixed.value == 16 and "genai_config.json" in fixed.why


def test_multi_head_attention_mask_is_past_plus_new():
    ops = op_dims(cache_model("MultiHeadAttention", mask=True))
    assert ops.pasts == {"past": "mha"} and ops.batch_one is None
    assert not ops.sums  # its mask's width is written "past+s": an expression, computed, not a dim to set


def test_static_cache_dims_fix_nothing_and_models_without_caches_say_nothing():
    assert not op_dims(genai_decoder(GenaiSpec(static_head_dim=True, layers=1))).fixed
    assert op_dims(group_query_decoder()).pasts == {"past_sequence_length": "gqa"}
    no_cache = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    assert not op_dims(no_cache)


def test_rotary_tables_given_as_inputs_cover_the_past_and_the_new_tokens():
    """onnxscript's GQA fusion tests feed cos/sin [max_seqlen, Dh / 2]: the rows must reach P + S (was: max_seqlen
    left at the default 8 below P + S, 'cos_cache dimension 0 shall not be less than total_sequence_length')."""
    fused, unfused = op_dims(fused_rotary_gqa()), op_dims(unfused_rotary_gqa())
    assert [(c.rows, c.parts) for c in fused.covers] == [("max_seqlen", ("P", "S"))]
    assert [(c.rows, c.parts) for c in unfused.covers] == [("max_seqlen", ("P", "S"))]  # every other length
    assert fused.apply({"P": 6, "S": 8, "max_seqlen": 8})["max_seqlen"] == 14
    assert fused.apply({"P": 6, "S": 8, "max_seqlen": 8}, {"max_seqlen": 8})["max_seqlen"] == 8  # the user's


def test_a_window_buffer_is_its_window_long_and_the_total_reaches_it():
    """GenAI's Gemma 2 sliding layer (sliding_window_cache): its buffer dim is local_window_size, no past and no part
    of the total; the total is raised to the window, through the past at a step and the new tokens at a prefill
    (the lengths where the kernel's present has no unspecified slot)."""
    ops = op_dims(genai_decoder(GenaiSpec(layers=2, window=8, sliding=(0,))))
    assert ops.fixed["past_sliding_length"].value == 8 and "sliding_window_cache" in ops.fixed["past_sliding_length"].why
    assert "past_sliding_length" not in ops.pasts and ops.windows == {"past_sliding_length"}
    assert [(s.total, s.parts) for s in ops.sums] == [("total_sequence_length", ("past_sequence_length",
                                                                                 "sequence_length"))]
    assert ops.floors["total_sequence_length"].value == 8
    step = ops.decode({"batch_size": 2, "past_sequence_length": 2, "sequence_length": 3}, {})
    assert (step["past_sequence_length"], step["sequence_length"], step["total_sequence_length"]) == (5, 3, 8)
    assert step["past_sliding_length"] == 8 and step["batch_size"] == 1
    prefill = ops.prefill(step, {}, {"batch_size": 2})
    assert (prefill["past_sequence_length"], prefill["sequence_length"], prefill["total_sequence_length"]) == (0, 8, 8)
    assert prefill["past_sliding_length"] == 8
    assert ops.within_limits(step) and not ops.within_limits({**step, "total_sequence_length": 7})
    long = ops.decode({"batch_size": 1, "past_sequence_length": 20, "sequence_length": 1}, {})
    assert (long["past_sequence_length"], long["total_sequence_length"]) == (20, 21)  # long enough: kept


def test_a_window_buffer_decoder_fuses_as_a_user_runs_it():
    """No --dims: the search runs at the window's buffer and verifies a step and a prefill."""
    from trtattn.rewrite.fuse import fuse_model

    result = fuse_model(genai_decoder(GenaiSpec(layers=2, window=8, sliding=(0,))))
    assert result.ok, [r.row() for r in result.reports]
    dims = [result.dims["values"], *result.dims.get("also_verified_at", [])]
    assert len(dims) == 2 and all(d["past_sliding_length"] == 8 and d["total_sequence_length"] >= 8 for d in dims)
    assert {d["past_sequence_length"] for d in dims} >= {0}
