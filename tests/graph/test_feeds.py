"""Verification inputs the model can run on (issue 10, item 4) and that mean what the model means
(the mask polarity of item 7): graph/roles.py, dim_names.py, feeds.py and graph/dims.py (dims that fit).

Hand-built graphs for each case (a length baked into a Reshape, strided convolutions, two
symbolic names for one dim, dims written -1 or '?', masks True at the padding with and without
metadata, flags, a model no dims fit), then the zoo's "dims" entries and luong-gru."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ort_run
from trtattn.graph.dim_names import name_free_dims, resolve_dims
from trtattn.graph.dims import DimsDoNotFit, fit_dims
from trtattn.graph.feeds import make_feeds
from trtattn.graph.roles import input_specs, kept_tokens

FILL = np.float32(-np.inf)


def _model(nodes, inputs, outputs, inits=(), meta=None, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    if meta is not None:
        model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return model


def _shapes(model, **kwargs):
    return {k: v.shape for k, v in make_feeds(model, **kwargs).items()}


# ---------------------------------------------------------------- dims
def _pair(ids_dims, mask_dims):
    """ids + mask -> one output: only runs when both have the same shape."""
    nodes = [helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.INT64),
             helper.make_node("Add", ["ids", "maskf"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ids_dims),
                          helper.make_tensor_value_info("mask", TensorProto.INT64, mask_dims)],
                  [helper.make_tensor_value_info("y", TensorProto.INT64, None)])


def test_dims_written_minus_one_or_question_mark_are_symbolic():
    model = _pair([-1, "?"], ["unk__0", "unk__1"])
    assert _shapes(model) == {"ids": (2, 8), "mask": (2, 8)}  # batch and sequence unified by position
    assert _shapes(model, dims={"seq": 5}) == {"ids": (2, 5), "mask": (2, 5)}
    assert _shapes(model, dims={"unk__0": 3}) == {"ids": (3, 8), "mask": (3, 8)}  # a member sets its dim
    fit = fit_dims(model)
    assert ort_run(model, make_feeds(model, dims=fit))[0].shape == (2, 8)
    assert any("ids[0]" in r and "unk__0" in r for r in fit.reasons), fit.reasons


def test_two_symbolic_names_for_one_batch():
    model = _pair(["s33", "s50"], ["s6", "s50"])  # torch.export: one symbol per dim it could not prove equal
    dims = resolve_dims(model, {"batch": 3})
    assert dims["s33"] == dims["s6"] == 3 and dims["s50"] == 8
    assert _shapes(model, dims={"s6": 4}) == {"ids": (4, 8), "mask": (4, 8)}
    assert _shapes(model, dims={"s33": 4, "s6": 4, "s50": 6}) == {"ids": (4, 6), "mask": (4, 6)}
    fit = fit_dims(model, {"batch": 3})
    assert ort_run(model, make_feeds(model, dims=fit))[0].shape == (3, 8)


def test_name_free_dims_writes_the_unified_names():
    model = _pair([-1, "?"], ["s6", "s50"])
    before = model.SerializeToString()
    named = name_free_dims(model)
    assert model.SerializeToString() == before
    assert [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in named.graph.input] == [["batch", "seq"]] * 2
    declared = _pair(["batch", "seq"], ["batch", "seq"])
    assert name_free_dims(declared) is declared


def test_length_baked_into_a_reshape():
    """TorchScript wrote the example's length (7) into a Reshape target."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    model = _model([helper.make_node("Reshape", ["x", "target"], ["y"], name="baked")], [x],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [("target", np.array([2, 7, 2, 2], np.int64))])
    with pytest.raises(Exception, match="baked"):
        ort_run(model, make_feeds(model))
    fit = fit_dims(model)
    assert fit["seq"] == 7 and fit["batch"] == 2
    assert "seq=7" in fit.reasons[-1] and "Reshape node 'baked'" in fit.reasons[-1], fit.reasons
    assert ort_run(model, make_feeds(model, dims=fit))[0].shape == (2, 7, 2, 2)
    assert fit_dims(model, fit) is fit  # fitted dims are not checked again


def _strided(kernel: int, *, out_len=None):
    """Raw samples through a strided convolution: shorter inputs than one kernel cannot run."""
    x = helper.make_tensor_value_info("samples", TensorProto.FLOAT, ["batch", "length"])
    nodes = [helper.make_node("Unsqueeze", ["samples", "one"], ["x3"]),
             helper.make_node("Conv", ["x3", "w"], ["feat"], name="conv", strides=[kernel // 2]),
             helper.make_node("Softmax", ["feat"], ["y"], axis=-1)]
    w = np.full((2, 1, kernel), 1.0 / kernel, np.float32)
    return _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, out_len])],
                  [("one", np.array([1], np.int64)), ("w", w)])


def test_strided_convolution_grows_the_length():
    model = _strided(200)
    fit = fit_dims(model)
    assert fit["length"] == 256  # the first length doubled from 8 that holds one kernel
    assert "Conv node 'conv'" in fit.reasons[-1]
    assert ort_run(model, make_feeds(model, dims=fit))[0].shape == (2, 2, 1)


def test_output_written_as_an_expression_of_the_inputs():
    """torch.export writes output dims as expressions of the input dims: a length that would give
    an empty output is not a fit (and is skipped without a run)."""
    model = _strided(200, out_len="(length-200)//100+1")
    assert fit_dims(model)["length"] == 256


def test_no_dims_fit_is_one_line_naming_the_node(tmp_path):
    from trtattn.cli import main

    model = _strided(70000)  # longer than any length tried
    with pytest.raises(DimsDoNotFit) as e:
        fit_dims(model)
    message = str(e.value)
    assert "\n" not in message and "Conv node 'conv'" in message and "--dims" in message and "length=N" in message
    fit = fit_dims(model, {"length": 70000})  # what the message asks for
    assert ort_run(model, make_feeds(model, dims=fit))[0].shape == (2, 2, 1)
    path = tmp_path / "conv.onnx"
    onnx.save(model, path)
    assert main(["-q", "fuse", str(path), "-o", str(tmp_path / "out.onnx")]) == 2  # not 3: not an internal error


# ---------------------------------------------------------------- masks and flags
def _masked(where: str, meta=None):
    """logits [B, S] masked by a boolean mask in one of the ways exporters write it."""
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq"])
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "seq"])
    nodes, inits = [], [("fill", np.array(FILL)), ("zero", np.array(0, np.int64)), ("one", np.array(1.0, np.float32)),
                        ("big", np.array(-3.4e38, np.float32))]
    if where == "fill_where_true":  # masked_fill(mask, -inf): True at padding
        nodes.append(helper.make_node("Where", ["mask", "fill", "logits"], ["masked"]))
    elif where == "keep_where_true":
        nodes.append(helper.make_node("Where", ["mask", "logits", "fill"], ["masked"]))
    elif where == "not":  # masked_fill(~mask, -inf): True at tokens
        nodes += [helper.make_node("Not", ["mask"], ["pad"]), helper.make_node("Where", ["pad", "fill", "logits"], ["masked"])]
    elif where == "equal_zero":
        nodes += [helper.make_node("Cast", ["mask"], ["m64"], to=TensorProto.INT64),
                  helper.make_node("Equal", ["m64", "zero"], ["pad"]),
                  helper.make_node("Where", ["pad", "fill", "logits"], ["masked"])]
    elif where == "one_minus":  # (1 - mask) * -big + logits: True at tokens
        nodes += [helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "mf"], ["inv"]), helper.make_node("Mul", ["inv", "big"], ["add"]),
                  helper.make_node("Add", ["logits", "add"], ["masked"])]
    elif where == "both":  # two uses that disagree: the graph does not say
        nodes += [helper.make_node("Where", ["mask", "fill", "logits"], ["m1"]),
                  helper.make_node("Where", ["mask", "m1", "fill"], ["masked"])]
    nodes.append(helper.make_node("Softmax", ["masked"], ["y"], axis=-1))
    return _model(nodes, [logits, mask], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, meta)


@pytest.mark.parametrize("where,true_at", [("fill_where_true", "padding"), ("keep_where_true", "tokens"),
                                           ("not", "tokens"), ("equal_zero", "tokens"), ("one_minus", "tokens"),
                                           ("both", None)])
def test_mask_polarity_from_how_the_graph_uses_it(where, true_at):
    model = _masked(where)
    role = next(s.role for s in input_specs(model) if s.name == "mask")
    assert role["kind"] == "padding_mask" and role.get("true_at") == true_at
    feeds = make_feeds(model, dims={"seq": 8})
    keep = kept_tokens(role, feeds["mask"])
    assert keep[0].all() and keep[1].sum() == 6  # the last row is padded, the first is not
    if true_at:  # every row keeps its tokens: no row fully masked, no NaN
        assert np.isfinite(ort_run(model, feeds)[0]).all()


def test_mask_polarity_from_metadata():
    meta = {"inputs": {"mask": {"kind": "padding_mask", "true_at": "padding"}, "logits": {"kind": "float"}}}
    model = _masked("both", meta)  # the graph does not say; the metadata does
    feeds = make_feeds(model)
    assert not feeds["mask"][0].any() and feeds["mask"][1].sum() == 2  # True only at the last row's padding
    assert not make_feeds(model, padding=False)["mask"].any()


def test_no_query_row_is_left_without_a_key():
    """A row with no key is undefined in any model: a left-padded mask is padded only within the keys before the
    first query (none at a prefill, where a causal first query sees only itself), at the fitted dims and at the
    fit's other cache lengths alike; a right-padded one by less than the model's narrowest sliding window, so that
    the padded last query's window still reaches a token."""
    from trtattn.graph.feeds import most_padding, other_step_feeds, padded_keys

    assert [most_padding(8, "left", q) for q in (8, 7, 1, None)] == [0, 1, 7, 0]
    assert [padded_keys(16, "left", q) for q in (16, 14, 1)] == [0, 2, 4]
    assert [padded_keys(16, "right", 16, w) for w in (None, 8, 3, 2, 1)] == [4, 4, 2, 1, 0]
    assert most_padding(16, None, None) == 15
    for side, padded in (("left", False), ("right", True)):
        meta = {"inputs": {"mask": {"kind": "padding_mask", "side": side}, "logits": {"kind": "float"}}}
        model = _masked("both", meta)  # no token ids: every key is a query
        fitted, other = make_feeds(model, dims={"seq": 8}), other_step_feeds(model, dims={"seq": 8})
        for feeds in (fitted, other):
            assert bool((~feeds["mask"].astype(bool)).any()) == padded
        assert fitted["logits"].shape == other["logits"].shape


@pytest.mark.parametrize("past", [0, 3])
def test_a_left_padded_fp16_cache_fuses_at_every_past_length(tmp_path, past):
    """The fp16 Llama cache decoder at an empty past: its left padding at the prefill left the first queries no
    key, and fp16's overflowed masked logits made the original and the fused op disagree there (1.9, refused)."""
    from trtattn.graph import io
    from trtattn.rewrite.fuse import fuse_model
    from trtattn.testing.write_llama import PRESETS, write_llama

    write_llama(tmp_path / "llama.onnx", **{**PRESETS["tiny"], "dtype": "float16", "form": "cache"})
    model = io.load(tmp_path / "llama.onnx", load_external_data=False)
    result = fuse_model(model, dims={"past": past})
    assert result.ok and len(result.reports) == 2, [r.reason for r in result.reports]
    mask = make_feeds(model, dims={"past": past})["attention_mask"]
    assert int((mask == 0).sum()) == min(past, 2)  # padded within the past only


def test_a_right_padded_sliding_window_fp16_attention_fuses():
    """A padded query past its sliding window's reach had no key (a quarter of 16 keys padded, a window of 3):
    undefined, and in fp16 the fused op and the original's masked softmax differed there by 1.9 (refused). The
    verification pads less than the site's window (verify/compare.narrowest_window)."""
    from precision_models import fp16_sliding_window

    from trtattn.rewrite.fuse import fuse_model

    result = fuse_model(fp16_sliding_window(seq=16, window=3))
    assert result.ok and result.reports[0].site.window == 3, result.reports[0].reason


def test_flag_inputs():
    """A boolean of one element (use_cache_branch of a merged decoder) is a flag: True unless the
    metadata says otherwise; never a padding mask."""
    then = helper.make_graph([helper.make_node("Identity", ["a"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    inputs = [helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
              helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch"])]
    node = helper.make_node("If", ["use_cache_branch"], ["y"], then_branch=then, else_branch=other)
    model = _model([node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert input_specs(model)[0].role == {"kind": "flag"}
    feeds = make_feeds(model)
    assert feeds["use_cache_branch"].tolist() == [True]
    np.testing.assert_array_equal(ort_run(model, feeds)[0], feeds["a"])
    meta = {"inputs": {"use_cache_branch": {"kind": "flag", "value": False}, "a": {"kind": "float"}}}
    off = _model([node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], meta=meta)
    assert make_feeds(off)["use_cache_branch"].tolist() == [False]


def test_token_ids_vocab_is_the_embedding_tables_rows():
    """No metadata: an int input that indexes Gather(emb[V, H], ids) is token ids drawn below V (through a Cast);
    an int input that is Gather's data, not its indices, indexes no table."""
    vocab, hidden = 37, 4
    emb = np.arange(vocab * hidden, dtype=np.float32).reshape(vocab, hidden)
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Gather", ["emb", "ids32"], ["h"]),
             helper.make_node("Gather", ["table_ids", "idx"], ["picked"])]
    model = _model(nodes, [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                           helper.make_tensor_value_info("table_ids", TensorProto.INT64, [vocab])],
                   [helper.make_tensor_value_info("h", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("picked", TensorProto.INT64, None)],
                   [("emb", emb), ("idx", np.array([0, 2], np.int64))])
    roles = {s.name: s.role for s in input_specs(model)}
    assert roles["input_ids"] == {"kind": "token_ids", "vocab": vocab}
    assert roles["table_ids"] == {"kind": "token_ids", "vocab": 2}  # no table: the default, not Gather's data rows
    feeds = make_feeds(model, dims={"seq": 64})
    assert feeds["input_ids"].max() >= 2 and feeds["input_ids"].max() < vocab  # spread over the table, inside it
    np.testing.assert_array_equal(ort_run(model, feeds)[0], emb[feeds["input_ids"]])


def test_token_ids_read_inside_a_branch_find_their_table():
    """The embedding Gather inside an If branch (a merged decoder's): the branch's reads are indexed too."""
    vocab = 23
    branch = helper.make_graph([helper.make_node("Gather", ["emb", "input_ids"], ["h_then"])], "then", [],
                               [helper.make_tensor_value_info("h_then", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Gather", ["emb", "input_ids"], ["h_else"])], "else", [],
                              [helper.make_tensor_value_info("h_else", TensorProto.FLOAT, None)])
    model = _model([helper.make_node("If", ["use_cache_branch"], ["h"], then_branch=branch, else_branch=other)],
                   [helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
                    helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
                   [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
                   [("emb", np.ones((vocab, 4), np.float32))])
    assert {s.name: s.role for s in input_specs(model)}["input_ids"] == {"kind": "token_ids", "vocab": vocab}
    assert ort_run(model, make_feeds(model))[0].shape[-1] == 4


# ---------------------------------------------------------------- the zoo
# wav2vec2's dynamo exports (~20 s each) in the slow lane: its TorchScript export keeps the case fast
DIMS_ENTRIES = [("wav2vec2", "torchscript"), pytest.param("wav2vec2", "dynamo", marks=pytest.mark.slow),
                pytest.param("wav2vec2-sdpa", "dynamo", marks=pytest.mark.slow),
                ("led", "torchscript"), ("bert-foreign-dims", "torchscript"), ("bert-foreign-dims", "dynamo")]


@pytest.mark.parametrize("name,exporter", DIMS_ENTRIES)
def test_zoo_dims_entries_get_dims_they_run_on(zoo_export, name, exporter):
    model = onnx.load(zoo_export(name, exporter))
    fit = fit_dims(model)
    for seed in (0, 1):  # the verification's inputs
        outputs = ort_run(model, make_feeds(model, dims=fit, seed=seed))
        assert all(o.size and np.isfinite(o).all() for o in outputs if o.dtype.kind == "f")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_luong_mask_true_at_padding(zoo_export, exporter):
    """The Luong finding: the mask is True at padding; fed that way, no row is fully masked and
    the single-query rewrite verifies exactly."""
    from trtattn.rewrite.fuse import fuse_model

    model = onnx.load(zoo_export("luong-gru", exporter))
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    del stripped.metadata_props[:]  # without metadata, the graph's Where(mask, -inf, logits) says the same
    assert next(s.role for s in input_specs(stripped) if s.name == "src_key_padding_mask")["true_at"] == "padding"
    feeds = make_feeds(model)
    assert feeds["src_key_padding_mask"][-1].any() and not feeds["src_key_padding_mask"][0].any()
    assert all(np.isfinite(o).all() for o in ort_run(model, feeds))
    result = fuse_model(model)
    assert result.ok and [r.status for r in result.reports] == ["fused"], [r.row() for r in result.reports]
    assert result.verification.max_abs_err <= 1e-5


def test_wav2vec2_fuses_and_verifies_on_the_dims_that_fit(zoo_export, tmp_path):
    """`fuse` and `verify` feed the original on dims it runs on (512 samples), without --dims."""
    from trtattn.cli import main
    from trtattn.rewrite.fuse import fuse_model

    original = zoo_export("wav2vec2", "torchscript")
    result = fuse_model(onnx.load(original))
    assert result.ok and len(result.reports) == 2, [r.row() for r in result.reports]
    fused = tmp_path / "fused.onnx"
    onnx.save(result.model, fused)
    assert main(["-q", "verify", str(fused), "--onnx", str(original)]) == 0


# ---------------------------------------------------------------- dim names and lengths of one (issue 26)
def test_dims_spelled_with_a_dot_are_names_not_expressions():
    """paddle2onnx writes its dynamic dims 'DynamicDimension.0', '.1', ...: each is a dim of its own (its
    recogniser runs only at a height of 32, its width free), not one name 'DynamicDimension' read off an
    expression (which tried every dim at once and found none)."""
    from trtattn.graph.dim_names import names_in
    from trtattn.zoo.foreign import ROOT

    assert names_in("DynamicDimension.1") == ["DynamicDimension.1"]
    assert names_in("past + seq") == ["past", "seq"] and names_in("((s50//80)-3)//2") == ["s50"]
    assert names_in("batch") == ["batch"] and names_in("a.b") == ["a.b"]
    model = onnx.load(ROOT / "paddle-recognizer.paddle2onnx.onnx")
    fit = fit_dims(model)
    assert fit["DynamicDimension.1"] == 32 and fit["DynamicDimension.2"] == 8, dict(fit)
    assert "DynamicDimension.1=32" in fit.reasons[-1], fit.reasons


def _downsampled(pooled: bool = False):
    """x [batch, seq, 8] -> a Conv of stride 8 over the sequence -> one-head attention over seq/8 positions, so
    that at the default seq=8 it has one query and one key. `pooled`: its keys and values are the mean over those
    positions, one key at every length."""
    rng = np.random.default_rng(0)
    inits = [(n, (rng.standard_normal(s) * 0.3).astype(np.float32))
             for n, s in (("conv_w", (8, 8, 8)), ("wq", (8, 8)), ("wk", (8, 8)), ("wv", (8, 8)))]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("Conv", ["xt", "conv_w"], ["c"], strides=[8], name="down"),
             helper.make_node("Transpose", ["c"], ["h"], perm=[0, 2, 1])]
    if pooled:
        nodes.append(helper.make_node("ReduceMean", ["h"], ["pooled"], axes=[1], keepdims=1))
    kv = "pooled" if pooled else "h"
    nodes += [helper.make_node("MatMul", ["h", "wq"], ["q"]), helper.make_node("MatMul", [kv, "wk"], ["k"]),
              helper.make_node("MatMul", [kv, "wv"], ["v"]), helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="attn"),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  inits + [("scale", np.array(8 ** -0.5, np.float32))])


def test_dims_give_every_attention_more_than_one_key():
    """At seq=8 the model runs but its attention has one key, where any softmax gives 1 and verification proves
    nothing: the search takes the next length where it has more (seq=16: two keys), and fuse verifies there."""
    from trtattn.rewrite.fuse import fuse_model

    model = _downsampled()
    assert ort_run(model, make_feeds(model))[0].shape == (2, 1, 8)  # it runs at the defaults
    fit = fit_dims(model)
    assert fit["seq"] == 16 and not fit.one_key
    assert "seq=16 (at seq=8 Softmax 'attn' has one key (query 1, key 1))" in fit.reasons, fit.reasons
    assert fit_dims(model, {"seq": 8})["seq"] == 8  # the user's dims are the user's
    result = fuse_model(model)
    assert result.dims["values"]["seq"] == 16 and result.ok
    assert result.verification.one_key is None and not result.reports[0].row()["one_key"]


@pytest.mark.parametrize("named", [True, False])
def test_an_attention_with_one_key_at_every_length_is_said(named):
    """Keys pooled to one position: no length gives more. The dims stay, and the site's row and the summary say
    that it was verified at one key only (by the site's output: also where the nodes have no names)."""
    from trtattn.report import site_table, verdict
    from trtattn.rewrite.fuse import fuse_model
    from trtattn.rewrite.normalize import normalize_model

    model = _downsampled(pooled=True)
    for node in model.graph.node if not named else ():
        node.name = ""
    fit = fit_dims(model)
    assert fit["seq"] == 8 and fit.one_key == {"y": (1, 1)}
    assert "has one key (query 1, key 1) at every length tried" in fit.reasons[-1], fit.reasons
    assert fit.runs > 1  # the first run and every longer length tried are counted
    result = fuse_model(model)
    [report] = result.reports
    row = report.row()
    assert report.status.value == "fused" and row["one_key"] and "key length of 1" in row["notes"][-1]
    assert result.verification.one_key == [report.site.name]
    assert f"verified at one key only, which proves nothing: {report.site.name}" in verdict(result.verification)
    assert "one key: unproven" in site_table([report])
    normalized = normalize_model(model)  # (its cleanup names unnamed nodes: the site is named by its Softmax there)
    assert normalized.verification.one_key == [r.site.name for r in normalized.sites]
    assert [r.site.output for r in normalized.sites] == [report.site.output]
