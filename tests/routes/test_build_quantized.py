"""`trtattn build --precision fp8|int8` (issue 12, item 2): the Q/DQ on Q, K and V feed IAttention, the Q/DQ after
the softmax becomes its normalization quantize type and scale, and the network (trtsim's executor, which
emulates that quantization) matches ONNX Runtime on the Q/DQ model. ModelOpt quantizes the zoo BERT on CPU,
calibrated at sequence 32 (ModelOpt leaves GEMMs under 16 unquantized).

The numerical check uses Q/DQ models whose other ops stay fp32 (ModelOpt's high_precision_dtype="fp32"): ONNX
Runtime's fp16 MatMul on CPU accumulates in fp16 (0.054 on an attention output of 1.6), which would hide what
is checked; `build` itself quantizes with fp16 around the Q/DQ (what TensorRT runs), checked structurally."""

from types import SimpleNamespace

import onnx
import pytest

from trtattn.errors import TrtattnError
from trtattn.graph.feeds import make_feeds
from trtattn.rewrite.quantize import stack_feeds
from trtattn.rewrite.quantize.source import normalization_quantize, qdq_types
from trtattn.routes.prepare import Limits, prepare

DIMS = {"seq": 32}
LIMITS = Limits(max_batch=4, max_positions=64)
TOLERANCE = 1e-3  # network vs the Q/DQ model, of each output's largest value (measured: 0, the output Q/DQ snaps both)


@pytest.fixture(scope="module")
def bert(zoo_export):
    pytest.importorskip("modelopt.onnx.quantization", reason="ModelOpt's ONNX quantization (the quant extra)")
    return onnx.load(str(zoo_export("bert", "torchscript")))


@pytest.fixture(scope="module")
def calib(bert):
    return stack_feeds([make_feeds(bert, dims=DIMS, seed=s, padding=False) for s in range(8)])


@pytest.fixture(scope="module")
def quantized(bert, calib):
    """Q/DQ models with fp32 around the Q/DQ, built from as they are (their own Q/DQ)."""
    from trtattn.rewrite.normalize import normalize_model
    from trtattn.rewrite.quantize import quantize

    normalized = normalize_model(bert).model
    out = {}
    for mode in ("int8", "fp8"):
        model = quantize(normalized, mode, calib, high_precision_dtype="fp32").model
        out[mode] = prepare(model, name=f"bert-{mode}", precision=mode, dims=DIMS, limits=LIMITS)
    return out


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_every_site_takes_its_softmax_qdq_as_normalization_quantize(quantized, mode):
    prepared = quantized[mode]
    assert qdq_types(prepared.source_model) == {mode}
    sites = {r.attention_node: r.site for r in prepared.fused.reports}
    assert len(prepared.plan.native) == 2
    for a in prepared.plan.native:
        probs = sites[a.node].quant.probs
        assert a.dtype == a.normalization_quantize_to_type == mode
        assert a.normalization_quantize_scale == pytest.approx(probs.scale)
        assert a.q_scale == 1.0  # normalised: the softmax scale is on Q, before its Q/DQ
    # the cut model's Q, K and V of every site come out of a DequantizeLinear: the Q/DQ feed IAttention
    producer = {o: n for n in prepared.cut.model.graph.node for o in n.output}
    for a in prepared.plan.native:
        for t in (a.query, a.key, a.value):
            node = producer[prepared.cut.exposed.get(t, t)]
            assert node.op_type == "DequantizeLinear", (a.site, t, node.op_type)
    assert prepared.plan.precision_table.get(mode, 0) > 0.5, prepared.plan.precision_table


@pytest.mark.reference
@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_network_with_normalization_quantize_matches_the_qdq_model(checked_trt, quantized, mode):
    """trtsim quantizes the softmax output as IAttention's normalization quantize does; ONNX Runtime runs the
    Q/DQ model with its explicit Q/DQ after the Softmax. Dropping the emulation breaks it (checked below)."""
    from trtsim_reference import reference_errors

    prepared = quantized[mode]
    errors = reference_errors(checked_trt, prepared, prepared.source_model, dims=DIMS)
    worst = max(r for _, r in errors.values())
    assert worst <= TOLERANCE, errors
    scales = [a.normalization_quantize_scale for a in prepared.plan.native]
    for a in prepared.plan.native:  # without the normalization quantize the network drifts further
        a.dtype, a.normalization_quantize_to_type, a.normalization_quantize_scale = "fp32", None, None
    try:
        unquantized = max(r for _, r in reference_errors(checked_trt, prepared, prepared.source_model, dims=DIMS).values())
    finally:
        for a, scale in zip(prepared.plan.native, scales):
            a.dtype, a.normalization_quantize_to_type, a.normalization_quantize_scale = mode, mode, scale
    assert unquantized > 10 * TOLERANCE  # measured: 0.027 (int8), 0.079 (fp8) of the output's largest value


@pytest.mark.slow  # ModelOpt PTQ on CPU: ~35 s
def test_build_quantizes_with_modelopt_on_the_calibration_data(bert, calib, quantized):
    """The --calib route: normalised (scale on Q), ModelOpt PTQ with fp16 around the Q/DQ, checked against fp32,
    then every site's softmax Q/DQ as normalization quantize."""
    prepared = prepare(bert, name="bert-int8", precision="int8", calib=calib, dims=DIMS, limits=LIMITS)
    quantization = prepared.quantization
    assert quantization is not None and quantization.source == "ModelOpt PTQ" and quantization.placed == 2
    assert quantization.accuracy is not None and quantization.accuracy.passed
    assert [a.normalization_quantize_to_type for a in prepared.plan.native] == ["int8", "int8"]
    assert all(a.q_scale == 1.0 for a in prepared.plan.native)
    with pytest.raises(TrtattnError, match="quantized to int8, not fp8"):
        prepare(quantized["int8"].source_model, name="x", precision="fp8", limits=LIMITS)
    with pytest.raises(TrtattnError, match="needs calibration data"):
        prepare(bert, name="x", precision="int8", limits=LIMITS)


def _report(name, head, scale=0.0079, dtype="int8", zero=0):
    probs = SimpleNamespace(dtype=dtype, scale=scale, zero_point=zero)
    site = SimpleNamespace(name=name, head_size=head, quant=SimpleNamespace(probs=probs))
    return SimpleNamespace(site=site, attention_node=f"{name}/Attention")


def test_int8_sites_outside_the_fused_kernel_limits_are_named():
    """Published limits of TensorRT's fused INT8 attention: head size 16/32/64 and sequences <= 512."""
    reports = [_report("ok", 64), _report("wide", 128), _report("also-ok", 32)]
    settings, notes = normalization_quantize(reports, "int8", max_sequence=512)
    assert set(settings) == {"ok/Attention", "also-ok/Attention"}
    assert len(notes) == 1 and "wide" in notes[0] and "head size 128" in notes[0]
    settings, notes = normalization_quantize(reports, "int8", max_sequence=1024)
    assert not settings and all("1024" in n for n in notes)
    settings, notes = normalization_quantize([_report("fp8", 256, dtype="float8_e4m3fn")], "fp8", max_sequence=64)
    assert settings == {"fp8/Attention": ("fp8", 0.0079)} and not notes
