"""Every build setting of `trtattn build`, each with a test that fails when it is wrong (issue 12, item 7):
the optimisation profile, the dtype of each tensor entering IAttention, `decomposable`, the fp16 mask
clamp, the profiling verbosity and the default softmax scale. They read what the builder asked of the
real TensorRT bindings (trtsim's checked stand-in records every call) and, where it is a number, run the
recorded network on trtsim's numpy executor.
"""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from trtattn.routes.builder import build
from trtattn.routes.prepare import Limits, prepare
from trtattn.trt import compat
from trtattn.trt.lower import lower_attention
from trtattn.trt.network import build_network
from trtattn.trt.plan import AttentionPlan

pytestmark = pytest.mark.conformance

LIMITS = Limits(max_batch=8, max_positions=64, max_cache=32)


def _recorded(trt, prepared, tmp_path):
    build(prepared, trt, tmp_path, write=False, progress=False)
    assert not trt.sim.problems, trt.sim.problems
    return trt.sim.log


def _sets(log, owner, member):
    return [c.args["value"] for c in log if c.owner == owner and c.member == member and c.kind == "set"]


def _attentions(trt, prepared):
    """The recorded IAttention objects of the network the builder makes."""
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = build_network(trt, builder, trt.Logger(trt.Logger.WARNING), prepared.cut, prepared.plan)
    return network, [st.attention for st in network._layers if st.attention is not None and st.kind == "IAttentionInputLayer"]


def attention_only(scale=None, heads=2, head=16, dtype=T.FLOAT, mask=False) -> onnx.ModelProto:
    """q, k, v [B, N, S, H] (and an additive mask) -> ONNX Attention -> y: a model that is its own fused form."""
    inputs = [helper.make_tensor_value_info(n, dtype, ["batch", heads, "seq", head]) for n in "qkv"]
    names = ["q", "k", "v"]
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", T.FLOAT, ["batch", 1, "seq", "seq"]))
        names.append("mask")
    attrs = {} if scale is None else {"scale": scale}
    node = helper.make_node("Attention", names, ["y"], name="attention", **attrs)
    graph = helper.make_graph([node], "attention_only", inputs, [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


# ---------------------------------------------------------------- profiles
def test_profile_runs_to_the_models_limits_not_the_verification_dims(checked_trt, zoo_export, tmp_path):
    """Llama padded, batch <= 8 and 64 positions: every dynamic input 1 .. 8 x 64, opt half, whatever dims
    verified it."""
    model = onnx.load(str(zoo_export("llama", "torchscript")))
    prepared = prepare(model, name="llama", precision="fp32", limits=LIMITS, dims={"batch": 3, "seq": 5})
    log = _recorded(checked_trt, prepared, tmp_path)
    shapes = {c.args["input"]: (tuple(c.args["min"]), tuple(c.args["opt"]), tuple(c.args["max"]))
              for c in log if c.owner == "IOptimizationProfile" and c.member == "set_shape"}
    expected = ((1, 1), (4, 32), (8, 64))
    assert shapes == {name: expected for name in ("input_ids", "attention_mask", "position_ids")}
    assert len([c for c in log if c.member == "add_optimization_profile"]) == 1


@pytest.mark.parametrize("name,exporter", [("bert", "torchscript"), ("bert", "dynamo"), ("gpt2", "torchscript")])
def test_max_positions_from_a_table_gathered_by_a_sliced_position_buffer(zoo_export, name, exporter):
    """BERT gathers its position table with a slice of its registered position_ids buffer (0, 1, 2, ...):
    the table's 64 rows are the model's maximum positions, not the 2048 default."""
    from trtattn.trt.profiles import max_positions

    model = onnx.load(str(zoo_export(name, exporter)))
    assert max_positions(model) == (64, "its learned position table")


def test_kv_cache_profile_and_static_capacity_come_from_the_position_table(checked_trt, zoo_export, tmp_path):
    """Whisper's decoder has a learned position table of 64 rows: the caches' capacity is 64 (static in
    the network), packed tokens run to 8 x 64, rows to 8."""
    model = onnx.load(str(zoo_export("whisper-decoder-cache", "torchscript")))
    prepared = prepare(model, name="whisper", form="kv-cache", precision="fp32", limits=Limits(max_batch=8))
    assert prepared.plan.limits.max_positions == 64 and prepared.plan.limits.max_cache == 64
    log = _recorded(checked_trt, prepared, tmp_path)
    shapes = {c.args["input"]: (tuple(c.args["min"]), tuple(c.args["opt"]), tuple(c.args["max"]))
              for c in log if c.owner == "IOptimizationProfile" and c.member == "set_shape"}
    assert shapes["input_ids"] == ((1, 1), (1, 256), (1, 512))
    assert shapes["cu_seqlens"] == ((2,), (5,), (9,))
    assert shapes["past_key_values.0.decoder.key"] == ((1, 4, 64, 16), (4, 4, 64, 16), (8, 4, 64, 16))
    network, _ = _attentions(checked_trt, prepared)
    cache = next(t for t in network._inputs if t._name == "past_key_values.0.decoder.key")
    assert tuple(cache._shape) == (-1, 4, 64, 16)  # the capacity is static: TensorRT's KV-cache update wants it


def test_trtexec_style_shapes_override_the_defaults(zoo_export):
    from trtattn.errors import TrtattnError

    model = onnx.load(str(zoo_export("bert", "torchscript")))
    shapes = ({"input_ids": (1, 4)}, {"input_ids": (2, 16)}, {"input_ids": (2, 48)})
    prepared = prepare(model, name="bert", precision="fp32", limits=LIMITS, shapes=shapes)
    (profile,) = prepared.plan.profiles
    assert profile["input_ids"] == {"min": [1, 4], "opt": [2, 16], "max": [2, 48]}
    assert profile["attention_mask"] == {"min": [1, 1], "opt": [4, 32], "max": [8, 64]}  # not overridden
    with pytest.raises(TrtattnError, match="input_ids.*does not hold"):
        prepare(model, name="bert", precision="fp32", limits=LIMITS, shapes=({}, {}, {"input_ids": (2, 16)}))


# ---------------------------------------------------------------- dtypes entering IAttention
@pytest.mark.parametrize("precision,expected", [("fp32", "FLOAT"), ("fp16", "HALF"), ("bf16", "BF16")])
def test_every_tensor_entering_iattention_has_the_models_dtype(checked_trt, zoo_export, precision, expected):
    model = onnx.load(str(zoo_export("t5", "torchscript")))  # a float bias mask enters too
    prepared = prepare(model, name="t5", precision=precision, limits=LIMITS)
    _, attentions = _attentions(checked_trt, prepared)
    assert len(attentions) == 6
    for attn in attentions:
        q, k, v = (attn._in.slot(i) for i in range(3))
        mask = attn.slot("mask")
        assert {q._dtype.name, k._dtype.name, v._dtype.name} == {expected}, attn._name
        assert mask is None or mask._dtype.name in (expected, "BOOL"), (attn._name, mask._dtype.name)


# ---------------------------------------------------------------- decomposable
@pytest.mark.parametrize("decomposable", [False, True])
def test_decomposable_is_what_was_asked(checked_trt, zoo_export, tmp_path, decomposable):
    model = onnx.load(str(zoo_export("bert", "torchscript")))
    prepared = prepare(model, name="bert", precision="fp32", limits=LIMITS, decomposable=decomposable)
    log = _recorded(checked_trt, prepared, tmp_path)
    assert _sets(log, "IAttention", "decomposable") == [decomposable, decomposable]


# ---------------------------------------------------------------- the fp16 mask clamp
def test_fp16_attention_never_sees_an_infinite_mask(checked_trt, zoo_export):
    """T5 in fp16 with padding: the bias-and-padding mask entering IAttention is finite (fp16's replacing
    fill, finfo(fp16).min / 2, where masked), so a fully masked row cannot turn into NaN."""
    from trtsim.execute import run

    from trtattn.routes.prepare import form_adapter

    model = onnx.load(str(zoo_export("t5", "torchscript")))
    prepared = prepare(model, name="t5", precision="fp16", limits=LIMITS)
    network, attentions = _attentions(checked_trt, prepared)
    adapter = form_adapter(model, [i.name for i in prepared.plan.inputs], [])
    feeds = adapter.feeds(adapter.original_feeds(None, 0))
    assert (feeds["attention_mask"] == 0).any()  # real padding
    values = run(network, feeds, return_all=True)
    masks = [values[a.slot("mask")._name] for a in attentions if a.slot("mask") is not None]
    assert masks and all(m.dtype == np.float16 and np.isfinite(m).all() for m in masks)
    assert min(float(m.min()) for m in masks) == float(np.float16(np.finfo(np.float16).min / 2))


def test_lowering_clamps_an_fp32_mask_before_casting_it_to_fp16(checked_trt):
    """An fp32 additive mask (finfo(float32).min where masked) feeding fp16 attention: clamped to
    finfo(float16).min, then cast; never -inf."""
    from trtsim.execute import run

    trt = checked_trt
    net = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    tensors = {n: net.add_input(n, trt.float16, (1, 2, 4, 8)) for n in "qkv"}
    tensors["mask"] = net.add_input("mask", trt.float32, (1, 1, 4, 4))
    plan = AttentionPlan(site="s", node="n", layer="trtattn/attn/s", query="q", key="k", value="v", output="y",
                         q_scale=1.0, mask="mask", mask_kind="additive", q_heads=2, kv_heads=2, head_size=8,
                         dtype="fp16")
    y = lower_attention(trt, net, plan, tensors.__getitem__)
    y.name = "y"
    net.mark_output(y)
    rng = np.random.default_rng(0)
    mask = np.where(np.tril(np.ones((4, 4), bool)), 0, np.finfo(np.float32).min).astype(np.float32)[None, None]
    feeds = {n: rng.standard_normal((1, 2, 4, 8)).astype(np.float16) for n in "qkv"}
    values = run(net, {**feeds, "mask": mask}, return_all=True)
    attn = next(st.attention for st in net._layers if st.attention is not None)
    entering = values[attn.slot("mask")._name]
    assert entering.dtype == np.float16 and np.isfinite(entering).all()
    assert float(entering.min()) == float(np.finfo(np.float16).min)
    assert np.isfinite(values["y"]).all()


# ---------------------------------------------------------------- profiling verbosity
def test_profiling_verbosity_is_detailed_and_recorded(checked_trt, zoo_export, tmp_path):
    model = onnx.load(str(zoo_export("bert", "torchscript")))
    prepared = prepare(model, name="bert", precision="fp32", limits=LIMITS)
    blob, sidecar = build(prepared, checked_trt, tmp_path, write=False, progress=False)
    (verbosity,) = _sets(checked_trt.sim.log, "IBuilderConfig", "profiling_verbosity")
    assert verbosity == checked_trt.ProfilingVerbosity.DETAILED  # layer info then names kernels: inspect needs it
    assert sidecar["profiling_verbosity"] == "DETAILED"
    assert all(s["decomposable"] is False for s in sidecar["sites"])


# ---------------------------------------------------------------- the default softmax scale
@pytest.mark.parametrize("scale,expected", [(None, 0.25), (0.1, 0.1)])
def test_the_q_scale_is_the_attentions_or_its_default(checked_trt, scale, expected):
    """ONNX Attention without a scale attribute scales by 1/sqrt(head size) (16 -> 0.25): the network
    multiplies Q by exactly that, and the result equals ONNX Runtime's."""
    from trtsim.execute import run

    from trtattn.rewrite.precision import cpu_runner

    model = attention_only(scale=scale)
    prepared = prepare(model, name="scale", precision="fp32", limits=LIMITS)
    (plan,) = prepared.plan.native
    assert plan.q_scale == pytest.approx(expected)
    network, _ = _attentions(checked_trt, prepared)
    constants = [float(st.props["weights_array"].reshape(-1)[0]) for st in network._layers
                 if st.kind == "IConstantLayer" and st.name.endswith("/scale")]
    assert constants == [pytest.approx(expected)]
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 2, 5, 16)).astype(np.float32) for n in "qkv"}
    got = run(network, feeds)["y"]
    want = cpu_runner(model)[0](feeds)["y"]
    assert np.abs(got - want).max() <= 1e-5


def test_a_bf16_scale_is_an_fp32_constant_cast_to_bf16(checked_trt):
    """The bindings make Weights from float32/float16/int/bool arrays only (pyFoundationalTypes.cpp): a bf16
    Q scale is an fp32 constant and a cast, never an ml_dtypes array (which trtsim refuses as TensorRT does)."""
    trt = checked_trt
    net = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    tensors = {n: net.add_input(n, trt.bfloat16, (1, 2, 4, 8)) for n in "qkv"}
    plan = AttentionPlan(site="s", node="n", layer="trtattn/attn/s", query="q", key="k", value="v", output="y",
                         q_scale=0.125, q_heads=2, kv_heads=2, head_size=8, dtype="bf16")
    lower_attention(trt, net, plan, tensors.__getitem__)
    const = next(st for st in net._layers if st.kind == "IConstantLayer" and st.name.endswith("/scale"))
    assert const.props["weights_array"].dtype == np.float32
    cast = next(st for st in net._layers if st.kind == "ICastLayer" and st.inputs[0] is const.outputs[0])
    assert cast.props["to_type"] == trt.DataType.BF16
    import ml_dtypes

    with pytest.raises(Exception, match="bfloat16|Weights"):
        net.add_constant((1,), np.ones(1, ml_dtypes.bfloat16))
    assert compat.datatype(trt, "bfloat16") == trt.DataType.BF16


def test_build_refuses_a_fused_model_whose_outputs_failed_verification(zoo_export):
    """Every site within its bound but an output off (an 8B fp16 cache model): fuse keeps the original model,
    so build must stop there, naming the output (it went on and failed with a KeyError in the kv-cache form)."""
    from trtattn.errors import TrtattnError
    from trtattn.rewrite.fuse import fuse_model
    from trtattn.routes.prepare import all_fused

    result = fuse_model(onnx.load(str(zoo_export("llama", "torchscript"))))
    assert all_fused(result) is result  # verified: taken as it is
    result.verification = dataclasses.replace(result.verification, passed=False, outputs={"logits": 0.5}, slices=7)
    with pytest.raises(TrtattnError, match="output 'logits' is off by 0.5 .*in 7 slices of layers"):
        all_fused(result)
