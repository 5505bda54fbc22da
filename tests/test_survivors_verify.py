"""Issue 20's mutation survivors in verification and the build plan: each test fails when the line named in
its docstring is mutated (the tolerances, the guards that refuse a failed check, the plan's settings)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.errors import TrtattnError, VerificationError
from trtattn.rewrite.fuse import fuse_model
from trtattn.routes.prepare import forms
from trtattn.testing.graphs import attention_model
from trtattn.trt.plan import AttentionPlan
from trtattn.verify import compare_models, tolerance_for


def _scaled(model: onnx.ModelProto, name: str, factor: float) -> onnx.ModelProto:
    """A copy of `model` with initializer `name` multiplied by `factor` (in its own dtype)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    init = next(i for i in out.graph.initializer if i.name == name)
    value = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array((value.astype(np.float64) * factor).astype(value.dtype), name))
    return out


def _largest_weight(model: onnx.ModelProto) -> str:
    return max(model.graph.initializer, key=lambda i: int(np.prod(i.dims)) if len(i.dims) == 2 else 0).name


# ------------------------------------------------------------------ verify/compare.py: the fp16 rewrite tolerance
def fp16_block() -> onnx.ModelProto:
    """attention_model's block with its weights, input and output in fp16 (a model that computes in fp16)."""
    model = attention_model()
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        if value.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(value.astype(np.float16), init.name))
    for v in (model.graph.input[0], model.graph.output[0]):
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def test_fp16_rewrite_tolerance_catches_a_projection_off_by_ten_percent():
    """verify/tolerance.py (Check.REWRITE, fp16): the fused fp16 block passes (0.001), the same block with its
    Q projection scaled by 1.1 fails (0.09 against a bound of 0.028); x10 the tolerance, it passed."""
    model = fp16_block()
    atol, rtol = tolerance_for(model)
    fused = fuse_model(model)
    assert fused.ok and [r.status for r in fused.reports] == ["fused"]
    q_proj = model.graph.node[0].input[1]  # x @ Wq: the first MatMul
    assert model.graph.node[0].op_type == "MatMul"
    outcome = compare_models(model, _scaled(model, q_proj, 1.1), atol=atol, rtol=rtol)
    assert not outcome.passed and min(outcome.output_errors.values()) > 0.05, outcome.summary()


# ------------------------------------------------------------------ rewrite/precision/check.py: one element off
def _line_and_copy(n: int, off_at: int, off_by: float):
    """An fp32 original returning x, and an fp16 candidate returning x with element `off_at` moved by `off_by`."""
    from trtattn.rewrite.precision import check

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    original = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "o", [x], [y]),
                                 opset_imports=[helper.make_opsetid("", 17)])
    delta = np.zeros(n, np.float16)
    delta[off_at] = off_by
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Add", ["x16", "delta"], ["y16"]),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    candidate = helper.make_model(helper.make_graph(nodes, "c", [x], [y], [numpy_helper.from_array(delta, "delta")]),
                                  opset_imports=[helper.make_opsetid("", 17)])
    return check, original, candidate


def test_one_element_off_by_a_tenth_of_the_largest_fails_the_precision_check():
    """check.py:63 (`or` of the max and the L2 criteria): one element of 1000 off by 10% of the largest value
    has a relative L2 error of 0.006, under its bound; the max criterion alone must fail it."""
    n = 1000
    feeds = [{"x": np.linspace(-1.0, 1.0, n, dtype=np.float32)}]
    check, original, close = _line_and_copy(n, 10, 0.0)
    assert check.verify(original, close, feeds, precision="fp16")["y"].rel < 1e-3
    _, _, wrong = _line_and_copy(n, 10, 0.1)
    with pytest.raises(VerificationError, match=r"output 'y' is off by 0\.1 .*relative L2 0\.00"):
        check.verify(original, wrong, feeds, precision="fp16")


def test_every_element_off_by_a_little_fails_on_the_l2_criterion():
    """check.py:63 (the relative-L2 half): every element off by 1.5% of the largest value is within the max
    criterion (0.02) but not the L2 one (0.026 > 0.01): a drift that is everywhere fails."""
    from trtattn.rewrite.precision import check

    n = 1000
    feeds = [{"x": np.linspace(-1.0, 1.0, n, dtype=np.float32)}]
    _, original, _ = _line_and_copy(n, 0, 0.0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Add", ["x16", "drift"], ["y16"]),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    drift = numpy_helper.from_array(np.asarray(0.015, np.float16), "drift")
    drifted = helper.make_model(helper.make_graph(nodes, "c", [x], [y], [drift]),
                                opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(VerificationError, match=r"output 'y' is off by 0\.015 .*relative L2 0\.02"):
        check.verify(original, drifted, feeds, precision="fp16")


# ------------------------------------------------------------------ rewrite/forms: a form that fails is not built
def _tampering(real):
    """forms.verify_form that checks a copy of the derived model with its largest weight scaled by 1.5: a form
    whose rewrite went wrong."""
    def verify_form(form, original, derived, sites, **kwargs):
        return real(form, original, _scaled(derived, _largest_weight(derived), 1.5), sites, **kwargs)
    return verify_form


def test_a_form_that_fails_its_check_is_not_handed_on(zoo_export, monkeypatch):
    """forms/__init__.py:102 (the guard after verify_form): Llama's padded form (its RoPE lowered) that does not
    match the original raises, naming the form, instead of going on to the build (issue 20: 2.22 off)."""
    model = onnx.load(str(zoo_export("llama", "torchscript")))
    fused = fuse_model(model)
    assert fused.ok
    assert forms.derive("padded", model, fused).verification.passed
    monkeypatch.setattr(forms, "verify_form", _tampering(forms.verify_form))
    with pytest.raises(TrtattnError, match="the padded form does not match the original model"):
        forms.derive("padded", model, fused)


# ------------------------------------------------------------------ cli/fuse_trt.py: exit 1 on a failed CPU check
def test_fuse_ops_trt_exits_nonzero_and_writes_nothing_when_its_check_fails(zoo_export, tmp_path, monkeypatch,
                                                                             capsys):
    """cli/fuse_trt.py:79 (exit status): ViT's padded form is not re-verified (nothing lowered), so only the
    TensorRT-op model's check sees the tampered weights: it fails, nothing is written, the exit status is 1."""
    from trtattn.cli import main

    monkeypatch.setattr(forms, "verify_form", _tampering(forms.verify_form))
    out = tmp_path / "vit.trt.onnx"
    code = main(["-q", "fuse", str(zoo_export("vit", "torchscript")), "-o", str(out), "--ops", "trt",
                 "--precision", "fp32"])
    printed = capsys.readouterr().out
    assert code == 1 and "not written" in printed, printed
    assert not out.exists() and not out.with_suffix(".json").exists()


# ------------------------------------------------------------------ build.py: --max-cache
def test_max_cache_sets_the_cache_capacity_the_user_asked_for(zoo_export):
    """build.py:165 (limits.max_cache): the caches of the engine's I/O and its profiles are 24 long, the number
    passed, not the 64 maximum positions (asserted against 24, not plan.limits, the value under test)."""
    from trtattn.routes.prepare import Limits, prepare

    model = onnx.load(str(zoo_export("llama-cache", "torchscript")))
    prepared = prepare(model, name="llama-cache", form="kv-cache", precision="fp32",
                       limits=Limits(max_batch=2, max_positions=64, max_cache=24))
    caches = list(prepared.plan.aliases.values())
    assert caches
    inputs = {i["name"]: i for i in prepared.plan.inputs}
    assert all(inputs[c]["shape"][2] == 24 for c in caches), {c: inputs[c]["shape"] for c in caches}
    cut_inputs = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]
                  for i in prepared.cut.model.graph.input}
    assert all(cut_inputs[c][2] == 24 for c in caches), cut_inputs
    assert all(row["max"][2] == 24 for p in prepared.plan.profiles for name, row in p.items() if name in caches)


# ------------------------------------------------------------------ trt/plan.py: the plan JSON row
def test_plan_row_carries_the_normalization_quantize_type():
    """plan.py:75 (row()): `build --plan-json` says which sites IAttention quantizes after the softmax."""
    site = AttentionPlan("site", "attn", "layer", "q", "k", "v", "y", 0.25, dtype="int8",
                         normalization_quantize_to_type="int8", normalization_quantize_scale=1 / 127)
    assert site.row()["normalization_quantize_to_type"] == "int8"
    assert AttentionPlan("site", "attn", "layer", "q", "k", "v", "y", 0.25).row()["normalization_quantize_to_type"] \
        is None
