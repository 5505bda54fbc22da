"""A model already in fp16 converted to bf16 (issue 25): AutoCast goes between fp32 and one low precision, so the
fp16 floats are widened to fp32 first (exact) and the fp16 inputs and outputs put back after, through Casts.
Before, AutoCast stopped with "Cannot restore public graph output metadata for Y: element type changed".
An Attention reading its inputs in different dtypes is refused, naming the node."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from precision_models import bf16_attention, fp16_attention, needs_autocast

from trtattn.rewrite import precision as P
from trtattn.rewrite.precision.autocast import check_attention_types
from trtattn.rewrite.precision.common import declared_types
from trtattn.verify.tolerance import CONVERSION_BOUNDS, Check, tolerance


def _feeds(model):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return [{"x": np.random.default_rng(1).standard_normal(shape).astype(np.float16)}]


def _attention_input_types(model):
    types = declared_types(model)
    node = next(n for n in model.graph.node if n.op_type == "Attention")
    return [types.get(t) for t in node.input[:3]]


@needs_autocast
def test_fp16_model_converts_to_bf16_keeping_its_fp16_io():
    model = fp16_attention()
    converted = P.convert(model, "bf16", calibration_feeds=_feeds(model))
    out = converted.model
    onnx.checker.check_model(out, full_check=True)
    assert [v.type.tensor_type.elem_type for v in [*out.graph.input, *out.graph.output]] == [T.FLOAT16, T.FLOAT16]
    assert _attention_input_types(out) == [T.BFLOAT16] * 3
    assert converted.table.get("bf16", 0) > 0.95
    assert not any(i.data_type == T.FLOAT16 for i in out.graph.initializer)  # weights widened, then cast to bf16
    errors = P.verify(model, out, _feeds(model), precision="bf16")
    assert errors["y"].rel < CONVERSION_BOUNDS["bf16"]["rel"]


@needs_autocast
def test_fp16_model_to_bf16_io_without_keep_io_types():
    model = fp16_attention()
    out = P.convert(model, "bf16", keep_io_types=False, calibration_feeds=_feeds(model)).model
    assert [v.type.tensor_type.elem_type for v in [*out.graph.input, *out.graph.output]] == [T.BFLOAT16, T.BFLOAT16]
    assert _attention_input_types(out) == [T.BFLOAT16] * 3


@needs_autocast
def test_build_plan_of_an_fp16_attention_in_bf16():
    """`build --precision bf16` on an fp16 model (without TensorRT: the plan): every IAttention in bf16, the
    engine's IO in the model's fp16."""
    from trtattn.routes.prepare import prepare

    prepared = prepare(fp16_attention(), name="fp16_attention", precision="bf16")
    plan = prepared.plan
    assert plan.precision == "bf16" and plan.attentions
    assert {a.dtype for a in plan.attentions} == {"bf16"}
    assert [i.dtype for i in plan.inputs] == ["float16"] and [o.dtype for o in plan.outputs] == ["float16"]
    assert {T.BFLOAT16} == set(_attention_input_types(prepared.form_model))
    assert prepared.precision_check is not None and "emulated" in prepared.precision_check.run_on


def test_attention_reading_mixed_dtypes_is_refused_naming_the_node():
    model = fp16_attention()
    graph = model.graph
    graph.node.insert(3, helper.make_node("Cast", ["q"], ["q_bf16"], to=T.BFLOAT16, name="q_to_bf16"))
    attn = next(n for n in graph.node if n.op_type == "Attention")
    attn.input[0] = "q_bf16"
    graph.value_info.extend([helper.make_tensor_value_info("q_bf16", T.BFLOAT16, None),
                             helper.make_tensor_value_info("k", T.FLOAT16, None),
                             helper.make_tensor_value_info("v", T.FLOAT16, None)])
    with pytest.raises(P.PrecisionError, match=r"Attention node attn .*q_bf16 bf16, k fp16"):
        check_attention_types(model)
    attn.input[0] = "q"
    check_attention_types(model)  # one dtype: nothing to say


def _bf16_elementwise():
    """y = relu(x * c + b) in bf16: ops that compute one fp32 result per element, rounded once."""
    rng = np.random.default_rng(2)
    import ml_dtypes

    c = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "c")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    for t in (c, b):  # bf16 initializers: onnx's helper keeps bf16 as raw bits
        bits = np.asarray(numpy_helper.to_array(t), ml_dtypes.bfloat16).view(np.uint16)
        t.CopyFrom(helper.make_tensor(t.name, T.BFLOAT16, [16], bits.tobytes(), raw=True))
    nodes = [helper.make_node("Mul", ["x", "c"], ["xc"]), helper.make_node("Add", ["xc", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", T.BFLOAT16, [4, 16])],
                              [helper.make_tensor_value_info("y", T.BFLOAT16, [4, 16])], [c, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def test_bf16_model_emulated_on_onnx_runtime_rounds_every_bf16_tensor():
    """ONNX Runtime has no bf16 Mul: the runner is the emulation, which agrees bit for bit with onnx's reference
    evaluator (numpy over bf16) on ops rounding once per element, and differs from the same model in fp32."""
    import ml_dtypes
    from onnx.reference import ReferenceEvaluator

    from trtattn.rewrite.precision.emulate import EMULATION, bf16_emulated

    model = _bf16_elementwise()
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    run, runner = P.cpu_runner(model)
    assert runner == EMULATION
    got = run({"x": x})["y"]
    want = ReferenceEvaluator(model).run(None, {"x": x.astype(ml_dtypes.bfloat16)})[0].astype(np.float32)
    np.testing.assert_array_equal(got, want)
    unrounded = bf16_emulated(model)  # the same graph without its roundings: fp32 throughout
    kept = [n for n in unrounded.graph.node if not n.name.endswith(("/round_to_bf16", "/bf16_to_fp32"))]
    for n in kept:
        n.input[:] = [t.removesuffix("/bf16_value") for t in n.input]
        n.output[:] = [t.removesuffix("/fp32") for t in n.output]
    del unrounded.graph.node[:]
    unrounded.graph.node.extend(kept)
    fp32, _ = P.cpu_runner(unrounded)
    assert not np.array_equal(fp32({"x": x})["y"], got)


@needs_autocast
def test_fuse_trt_ops_in_bf16_verified_emulated():
    """`fuse --ops trt --precision bf16`: ONNX Runtime runs no bf16 MatMul, so the written model (TensorRT's ops on
    trtattn_plugins' kernels) is verified emulated in fp32, and the verification says so."""
    from trtattn.rewrite.precision.emulate import EMULATION
    from trtattn.routes.trt_ops import fuse_trt

    result = fuse_trt(fp16_attention(), name="fp16_attention", precision="bf16")
    assert result.ok and result.verification.run_on == EMULATION
    types = declared_types(onnx.shape_inference.infer_shapes(result.prepared.form_model))
    attn = next(n for n in result.prepared.form_model.graph.node if n.op_type == "Attention")
    assert {types[t] for t in attn.input[:3]} == {T.BFLOAT16}


@needs_autocast
def test_bf16_model_builds_in_bf16_read_widened():
    """A bf16 model is read widened to fp32 (ONNX Runtime cannot open it), verified there, converted back: the
    plan's IAttention and IO are bf16, and the plan says how it was checked."""
    from trtattn.routes.prepare import prepare

    model = bf16_attention()
    assert P.ort_support(model) is not None  # the premise: ONNX Runtime cannot open it
    prepared = prepare(model, name="bf16_attention", precision="bf16")
    plan = prepared.plan
    assert {a.dtype for a in plan.attentions} == {"bf16"} and plan.native
    assert {i.dtype for i in [*plan.inputs, *plan.outputs]} == {"bfloat16"}
    assert any("read widened to fp32" in n for n in plan.notes)
    assert "emulated" in prepared.precision_check.run_on


def test_bf16_model_asked_in_another_precision_is_refused_saying_why():
    from trtattn.routes.prepare import prepare

    with pytest.raises(P.PrecisionError, match="computes in bf16.*--precision bf16"):
        prepare(bf16_attention(), name="bf16_attention", precision="fp16")


def _bf16_initializer(name: str, values: np.ndarray) -> onnx.TensorProto:
    import ml_dtypes

    bits = np.asarray(values, ml_dtypes.bfloat16).view(np.uint16)  # onnx's helper keeps bf16 as raw bits
    return helper.make_tensor(name, T.BFLOAT16, list(values.shape), bits.tobytes(), raw=True)


def bf16_body(batch=2, heads=2, seq=5, head=16) -> onnx.ModelProto:
    """An attention written out in bf16 ops (softmax(Q.K^T * scale + bias) . V), its bias a bf16 initializer:
    ONNX Runtime's CPU provider cannot open it."""
    shape = [batch, heads, seq, head]
    bias = np.random.default_rng(4).standard_normal((seq, seq)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "bf16_body", [helper.make_tensor_value_info(n, T.BFLOAT16, shape) for n in "qkv"],
                              [helper.make_tensor_value_info("y", T.BFLOAT16, shape)],
                              [_bf16_initializer("scale", np.array(0.25, np.float32)), _bf16_initializer("bias", bias)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def _inferred_types(model: onnx.ModelProto) -> dict[str, int]:
    return declared_types(onnx.shape_inference.infer_shapes(model, strict_mode=True))


def test_fuse_bf16_body_writes_a_bf16_attention_checked_emulated():
    """Plain fuse on a bf16 model: matched and verified on it widened to fp32, rewritten in the bf16 model itself
    (the Attention op and its mask in bf16, every kept tensor typed as before), verified emulated against the
    original emulated. Before, fit_dims stopped: "ONNX Runtime cannot open the model"."""
    from trtattn.graph import validate
    from trtattn.rewrite import bf16
    from trtattn.rewrite.fuse import fuse_model

    model = bf16_body()
    assert P.ort_support(model) is not None  # the premise: ONNX Runtime cannot open it
    result = fuse_model(model)
    assert result.ok and result.changed, [r.reason for r in result.reports]
    out = result.model
    assert [n.op_type for n in out.graph.node].count("Attention") == 1 and "Softmax" not in {
        n.op_type for n in out.graph.node}
    assert result.verification.run_on == bf16.RUN_ON and result.verification.widened_fp32.passed
    assert 0 < result.verification.max_abs_err <= tolerance(Check.REWRITE, "bf16").atol
    onnx.checker.check_model(out, full_check=True)
    assert validate.findings(out) == []
    before, after = _inferred_types(model), _inferred_types(out)
    assert all(after[name] == t for name, t in before.items() if name in after)
    attn = next(n for n in out.graph.node if n.op_type == "Attention")
    assert {after[t] for t in attn.input if t} == {T.BFLOAT16} and after[attn.output[0]] == T.BFLOAT16
    assert not any(i.data_type == T.FLOAT for i in out.graph.initializer)


def test_fuse_command_on_a_bf16_model_writes_it_in_bf16_saying_how_checked(tmp_path, capsys):
    from trtattn.cli import main
    from trtattn.rewrite import bf16

    src, out = tmp_path / "bf16.onnx", tmp_path / "fused.onnx"
    onnx.save(bf16_body(), str(src))
    assert main(["-q", "fuse", str(src), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert bf16.RUN_ON in text and "CPU provider cannot run it (its CUDA provider can)" in text
    written = onnx.load(str(out))
    assert [v.type.tensor_type.elem_type for v in [*written.graph.input, *written.graph.output]] == [T.BFLOAT16] * 4
    assert "Attention" in {n.op_type for n in written.graph.node}


def test_normalize_bf16_body_rewrites_it_in_bf16_checked_emulated():
    """normalize on a bf16 model: probed widened, the scale moved onto Q in the bf16 model itself (the new constant
    bf16), verified emulated; every kept tensor typed as before. Before: "ONNX Runtime cannot open the model"."""
    from trtattn.graph import validate
    from trtattn.rewrite import bf16
    from trtattn.rewrite.normalize import normalize_model

    model = bf16_body()
    result = normalize_model(model)
    assert result.ok and result.changed and [s.action for s in result.sites] == ["rewritten"]
    assert result.verification.passed and result.verification.run_on == bf16.RUN_ON
    assert result.notes == [bf16.NOTE]
    out = result.model
    assert validate.findings(out) == [] and bf16.type_change(model, out) is None
    before, after = _inferred_types(model), _inferred_types(out)
    assert all(after[name] == t for name, t in before.items() if name in after)
    assert not any(i.data_type == T.FLOAT for i in out.graph.initializer)
    q_scale = next(n for n in out.graph.node if n.op_type == "Mul" and "q" in n.input)
    assert after[q_scale.output[0]] == T.BFLOAT16


def test_normalize_command_on_a_bf16_attention_op_writes_it_unchanged(tmp_path, capsys):
    """One bf16 ONNX Attention (already TensorRT's form): exit 0, the output is the input; before, exit 2."""
    from trtattn.cli import main

    src, out = tmp_path / "bf16.onnx", tmp_path / "normal.onnx"
    onnx.save(bf16_attention(), str(src))
    assert main(["-q", "normalize", str(src), "-o", str(out)]) == 0
    assert "CPU provider cannot run it (its CUDA provider can)" in capsys.readouterr().out
    assert out.read_bytes() == src.read_bytes()


def test_an_fp16_output_read_inside_the_graph_is_put_back_with_its_readers_kept_in_fp32():
    """narrow_io on an output `y` (Mul) that Add also reads: the Add reads the fp32 value `y/fp32`, only the
    graph output goes through the Cast back to fp16, and ONNX Runtime runs it: y in fp16, z = x + y in fp32."""
    from onnx.reference import ReferenceEvaluator

    from trtattn.rewrite.precision.widen import narrow_io

    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"], name="double"),
             helper.make_node("Add", ["x", "y"], ["z"], name="sum")]
    graph = helper.make_graph(nodes, "narrowed", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("z", T.FLOAT, [2, 3])], [two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    narrow_io(model, {"y": T.FLOAT16})
    onnx.checker.check_model(model, full_check=True)
    assert next(n for n in model.graph.node if n.name == "sum").input[:] == ["x", "y/fp32"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    y, z = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert y.dtype == np.float16 and z.dtype == np.float32
    np.testing.assert_array_equal(y, (2 * x).astype(np.float16))
    np.testing.assert_array_equal(z, 3 * x)
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(["z"], {"x": x})[0], 3 * x)


def test_a_bf16_model_onnx_runtime_refuses_even_emulated_says_onnx_runtimes_reason():
    """A bf16 model with an op no runner knows: ONNX Runtime refuses the fp32 emulation too, and the refusal
    says so with ONNX Runtime's own reason (naming the op), then the reference evaluator's."""
    model = _bf16_elementwise()
    model.graph.node[2].op_type, model.graph.node[2].domain = "NoSuchRelu", "example.unknown"
    model.opset_import.append(helper.make_opsetid("example.unknown", 1))
    refused = r"emulated in fp32: .*NoSuchRelu.* is not a registered function/op\) and onnx.s reference evaluator failed"
    with pytest.raises(P.NotRunnableOnCpu, match=refused):
        P.cpu_runner(model)


def test_bf16_types_of_a_model_strict_inference_rejects_is_one_trtattn_error():
    """type_change on a model onnx's strict inference rejects (Add of [3] and [4]) as read and as written: the
    same findings, so it types them, and says inference fails on the bf16 model with onnx's reason."""
    import copy

    from trtattn.errors import TrtattnError
    from trtattn.rewrite import bf16

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"], name="bad_add")], "bad",
                              [helper.make_tensor_value_info("a", T.BFLOAT16, [3]),
                               helper.make_tensor_value_info("b", T.BFLOAT16, [4])],
                              [helper.make_tensor_value_info("c", T.BFLOAT16, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    reason = r"onnx.s shape inference fails on the bf16 model: .*node name: bad_add.*Incompatible dimensions"
    with pytest.raises(TrtattnError, match=reason):
        bf16.type_change(model, copy.deepcopy(model))
