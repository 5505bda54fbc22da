"""--quantize fp8|int8: NVIDIA ModelOpt's ONNX PTQ on CPU, checked site by site.

Without ModelOpt (the `quant` extra) only the calibration-data checks and the missing-dependency
message run; everything that quantizes skips with the reason. With it: on BERT, ViT and Llama
(zoo, TorchScript export) every attention carries Q/DQ on both inputs of both MatMuls with
nothing quantized between BMM1 and the Softmax, the quantized model runs on ONNX Runtime CPU
(FP8 included) within the documented tolerance of the fp32 original, and each site's scales are
recorded; hand-built graphs show the ModelOpt rules that leave an attention unquantized, named.
"""

import importlib.util
import sys

import numpy as np
import onnx
import pytest

from trtattn.errors import MissingDependencyError, TrtattnError
from trtattn.graph.feeds import make_feeds
from trtattn.rewrite import quantize as Q
from trtattn.testing.graphs import attention_model
from trtattn.verify.tolerance import QUANTIZATION_REL_L2

SEQ = 32  # ModelOpt skips attention MatMuls whose K or N is < 16 at the calibration shapes
DIMS = {"seq": SEQ, "dec_seq": SEQ}
MODELS = ["bert", "vit", "llama"]
MODES = ["int8", "fp8"]


def _has_modelopt() -> bool:
    if importlib.util.find_spec("modelopt") is None:
        return False
    try:
        Q._modelopt()
    except MissingDependencyError:
        return False
    return True


needs_modelopt = pytest.mark.skipif(not _has_modelopt(), reason="needs NVIDIA ModelOpt's ONNX quantization: "
                                                                 "pip install 'trtattn[quant]'")


def calibration(model, n=4, **dims):
    return Q.stack_feeds([make_feeds(model, seed=i, dims={**DIMS, **dims}) for i in range(n)])


_cache = {}


def quantized(zoo_export, name, mode):
    if (name, mode) not in _cache:
        model = onnx.load(str(zoo_export(name, "torchscript")))
        _cache[(name, mode)] = (model, Q.quantize(model, mode, calibration(model), calibration_method="max"))
    return _cache[(name, mode)]


# ---------------------------------------------------------------- calibration data (no ModelOpt needed)
@pytest.fixture(scope="module")
def bert(zoo_export):
    return onnx.load(str(zoo_export("bert", "torchscript")))


def _one_line(excinfo):
    text = str(excinfo.value)
    assert text and "\n" not in text
    return text


@pytest.mark.parametrize("change,expect", [
    (lambda c: c.pop("attention_mask"), "missing attention_mask"),
    (lambda c: c.update(pixel_values=np.zeros((2, 3), np.float32)), "unknown pixel_values"),
    (lambda c: c.update(input_ids=c["input_ids"][0]), "rank 1"),
    (lambda c: c.update(input_ids=c["input_ids"].astype(np.float32)), "is float32; the model input is int64"),
    (lambda c: c.update(attention_mask=c["attention_mask"][:3]), "different numbers of samples"),
    (lambda c: c.update(input_ids=c["input_ids"][:0]), "no samples"),
])
def test_bad_calibration_data_is_one_sentence(bert, change, expect):
    calib = calibration(bert)
    change(calib)
    with pytest.raises(Q.CalibrationError) as e:
        Q.quantize(bert, "int8", calib)
    assert expect in _one_line(e)


def test_calibration_file_errors(tmp_path, bert):
    with pytest.raises(Q.CalibrationError) as e:
        Q.load_calibration(tmp_path / "nope.npz")
    assert "no such calibration file" in _one_line(e)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(Q.CalibrationError) as e:
        Q.load_calibration(tmp_path / "junk.npz")
    assert "not a readable .npz" in _one_line(e)
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(Q.CalibrationError) as e:
        Q.load_calibration(tmp_path / "one.npy")
    assert "single array" in _one_line(e)
    good = calibration(bert)
    np.savez(tmp_path / "calib.npz", **good)
    loaded = Q.load_calibration(tmp_path / "calib.npz")
    assert set(loaded) == set(good) and all(np.array_equal(loaded[k], good[k]) for k in good)
    np.savez(tmp_path / "typo.npz", input_id=good["input_ids"], attention_mask=good["attention_mask"])
    with pytest.raises(Q.CalibrationError) as e:
        Q.quantize(bert, "fp8", Q.load_calibration(tmp_path / "typo.npz"))
    assert "expected exactly: input_ids, attention_mask" in _one_line(e)


def test_static_dims_are_checked():
    model = attention_model(heads=2, head=16)  # x: [batch, seq, 32]
    with pytest.raises(Q.CalibrationError) as e:
        Q.quantize(model, "int8", {"x": np.zeros((4, 8, 16), np.float32)})
    assert "axis 2 must be 32" in _one_line(e)


def test_bad_options(bert):
    for kwargs, expect in [({"mode": "int4"}, "unknown quantization mode"),
                           ({"mode": "fp8", "calibration_method": "percentile"}, "unknown calibration method"),
                           ({"mode": "fp8", "selection": "all"}, "unknown node selection")]:
        with pytest.raises(TrtattnError) as e:
            Q.quantize(bert, calib=calibration(bert), **kwargs)
        assert expect in _one_line(e)


def test_missing_modelopt_is_one_sentence(bert, monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt.onnx.quantization", None)
    with pytest.raises(MissingDependencyError) as e:
        Q.quantize(bert, "fp8", calibration(bert))
    assert "trtattn[quant]" in _one_line(e)


# ---------------------------------------------------------------- with ModelOpt
def _pair(model_nodes, producers, tensor):
    """(QuantizeLinear, DequantizeLinear) feeding `tensor` through Casts, read from the ONNX proto."""
    node = producers.get(tensor)
    while node is not None and node.op_type == "Cast":
        node = producers.get(node.input[0])
    if node is None or node.op_type != "DequantizeLinear":
        return None
    q = producers.get(node.input[0])
    return (q, node) if q is not None and q.op_type == "QuantizeLinear" else None


def _zero_point_type(model, name):
    for init in model.graph.initializer:
        if init.name == name:
            return init.data_type
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            return n.attribute[0].t.data_type
    return None


@needs_modelopt
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", MODELS)
def test_every_attention_matmul_input_has_qdq(zoo_export, name, mode):
    from trtattn import zoo

    model, result = quantized(zoo_export, name, mode)
    assert len(result.sites) == zoo.get(name).expected_sites
    assert result.ok, [(s.site, s.reason) for s in result.sites]
    # structurally, straight from the quantized ONNX graph
    q = result.model
    producers = {o: n for n in q.graph.node for o in n.output}
    nodes = {n.name: n for n in q.graph.node}
    want = onnx.TensorProto.FLOAT8E4M3FN if mode == "fp8" else onnx.TensorProto.INT8
    for s in result.sites:
        bmm1, bmm2 = nodes[s.bmm1], nodes[s.bmm2]
        for tensor in [*bmm1.input, *bmm2.input]:
            pair = _pair(q.graph.node, producers, tensor)
            assert pair is not None, f"{s.site}: no Q/DQ on {tensor}"
            assert _zero_point_type(q, pair[1].input[2]) == want
        # the Q/DQ on BMM2's first input quantizes the Softmax output
        qnode = _pair(q.graph.node, producers, bmm2.input[0])[0]
        src = producers[qnode.input[0]]
        while src.op_type != "Softmax":
            assert src.op_type in ("Where", "Cast", "Reshape", "Transpose"), src.op_type
            src = producers[src.input[2] if src.op_type == "Where" else src.input[0]]
        assert src.name == s.softmax
        # nothing quantized between BMM1 and the Softmax
        t, seen = nodes[s.softmax].input[0], 0
        while t in producers and producers[t].name != s.bmm1 and seen < 16:
            assert producers[t].op_type not in ("QuantizeLinear", "DequantizeLinear"), producers[t].name
            n = producers[t]
            t = next((i for i in n.input if i in producers and producers[i].op_type not in ("Constant",)), n.input[0])
            seen += 1
    assert result.settings["quantize_mode"] == mode and result.settings["calibration_eps"] == ["cpu"]


@needs_modelopt
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", MODELS)
def test_runs_on_onnxruntime_cpu_within_tolerance(zoo_export, name, mode):
    model, result = quantized(zoo_export, name, mode)
    feeds = [make_feeds(model, seed=100 + i, dims=DIMS, padding=False) for i in range(2)]
    errors = Q.compare(model, result.model, feeds)
    rel = max(e["rel"] for e in errors.values())
    assert 1e-4 < rel <= QUANTIZATION_REL_L2[mode], errors  # quantized for real, and close to fp32


@needs_modelopt
@pytest.mark.parametrize("mode", MODES)
def test_scale_record(zoo_export, mode):
    _, result = quantized(zoo_export, "llama", mode)
    for s in result.sites:
        row = s.row()
        assert row["placed"] and row["reason"] == ""
        scales = [row[k] for k in ("q_scale", "k_scale", "softmax_scale", "v_scale")]
        assert all(x is not None and np.isfinite(x) and x > 0 for x in scales), row
        assert row["qdq_dtype"] == Q.QDQ_DTYPES[mode]
        # the probabilities are in [0, 1]: max calibration puts their largest code at <= 127 (INT8)
        # or, with ModelOpt's INT8-to-FP8 scale conversion (x 448/127), at <= 127^2/448 (FP8)
        top = 127.0 if mode == "int8" else 127.0 ** 2 / 448.0
        assert 1.0 / row["softmax_scale"] <= top * 1.01
    summary = result.summary()
    assert summary.placed == len(summary.sites) == 2 and summary.mode == mode
    assert summary.to_json()["total"] == 2 and summary.to_json()["placed"] == 2


@needs_modelopt
def test_small_gemms_at_the_calibration_shapes_are_named(zoo_export):
    model = onnx.load(str(zoo_export("bert", "torchscript")))
    result = Q.quantize(model, "int8", calibration(model, seq=8), calibration_method="max")
    assert not result.ok
    for s in result.sites:
        assert not s.placed and s.q_scale is None
        assert "ModelOpt skips small GEMMs" in s.reason and "N=8" in s.reason, s.reason


@needs_modelopt
def test_modelopt_default_placement_leaves_add_masked_attention_unquantized():
    # MatMul(Q pre-scaled, K) -> Add(mask input) -> Softmax -> MatMul: the normalised form
    model = attention_model(scale_style="mul_q", mask_style="additive_input", heads=2, head=16)
    calib = calibration(model)
    default = Q.quantize(model, "fp8", calib, selection="modelopt")
    assert [s.placed for s in default.sites] == [False]
    assert "non-quantizable MHA partition" in default.sites[0].reason
    gemm = Q.quantize(model, "fp8", calib)
    assert gemm.ok and gemm.settings["selection"] == "gemm"
    feeds = [make_feeds(model, seed=9, dims=DIMS)]
    assert max(e["rel"] for e in Q.compare(model, gemm.model, feeds).values()) <= QUANTIZATION_REL_L2["fp8"]


@needs_modelopt
def test_fp8_rejects_attention_outside_the_fmha_pattern(zoo_export):
    # T5 adds a position bias and a mask: two Adds between BMM1 and the Softmax, not FP8 fMHA v2
    model = onnx.load(str(zoo_export("t5", "torchscript")))
    result = Q.quantize(model, "fp8", calibration(model, n=2))
    assert not any(s.placed for s in result.sites) and len(result.sites) == 6
    for s in result.sites:
        assert "not NVIDIA's FP8 fMHA v2 pattern" in s.reason and "-> Add -> Add -> Softmax" in s.reason, s.reason
    # the calibration convention: every input holds its samples along axis 0
    odd = attention_model(scale_style="mul_q", mask_style="bias_and_mask", heads=2, head=16)  # bias_index: [S, S]
    with pytest.raises(Q.CalibrationError) as e:
        Q.quantize(odd, "fp8", calibration(odd))
    assert "ModelOpt's convention" in _one_line(e)


def test_summary_json_keeps_the_reports_keys_in_order():
    """QuantSummary is JSON only where written: normalize's report keeps ModelOpt's settings beside the mode and the
    counts after the sites; build's ModelOpt summary leads with its source; the model's own Q/DQ says only that."""
    from trtattn.graph.user_inputs import InputsUsed

    sites = (Q.SiteQuant("a", True), Q.SiteQuant("b", False, "no Q/DQ"))
    accuracy = Q.QuantAccuracy({"y": {"max_abs": 0.5, "rel": 0.01, "ref_max": 3.0}}, 0.01, 0.05)
    checked = Q.QuantSummary("int8", settings={"quantize_mode": "int8"}, sites=sites, accuracy=accuracy)
    data = checked.to_json()
    assert list(data) == ["mode", "quantize_mode", "sites", "placed", "total", "accuracy"]
    assert (data["placed"], data["total"], data["sites"][1]["reason"]) == (1, 2, "no Q/DQ")
    assert data["accuracy"] == {"outputs": accuracy.outputs, "worst_relative": 0.01, "tolerance": 0.05, "passed": True}
    built = Q.QuantSummary("int8", "ModelOpt PTQ", {"quantize_mode": "int8"}, sites, accuracy, InputsUsed("file", "x"))
    assert list(built.to_json()) == ["source", *data, "inputs"]
    assert Q.QuantSummary("fp8", "the model's own Q/DQ").to_json() == {"mode": "fp8", "source": "the model's own Q/DQ"}
    unchecked = Q.QuantSummary("int8", settings={"quantize_mode": "int8"}, sites=sites).to_json()  # before its check
    assert list(unchecked) == ["mode", "quantize_mode", "sites", "placed", "total"]
    assert not Q.QuantAccuracy({}, 0.06, 0.05).passed
