"""The foreign-export corpus (tests/data/foreign/, made by trtattn/zoo/foreign/make.py): files written by
tf2onnx, paddle2onnx, jax2onnx, onnxconverter-common, onnxsim, onnxslim, ONNX Runtime's optimizer and
quantize_dynamic, onnx.inliner and low-opset exporters. Every file must end with each expected site found
(0 silent misses) and fused and verified, or listed with a reason that neither the ONNX Attention op nor
IAttention can express it. Files whose fix belongs to another class are xfail(strict) with that class, so
that the fix shows up as XPASS and the mark is removed."""

from __future__ import annotations

import collections
import json

import onnx
import pytest

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.zoo.foreign import MANIFEST, ROOT, load_manifest

ROWS = load_manifest()

# file -> why it does not pass yet (the issue-18 class whose fix it waits for)
WAITING = {
    "flax-mha-mask.jax2onnx.onnx": "class 12: flax zeroes masked probabilities and renormalises them (P * m / "
                                   "ReduceSum(P * m)): listed as 'the probabilities feed 2 nodes (Div, ReduceSum)'",
}

# reasons that mean neither the ONNX Attention op nor IAttention can express the site
INEXPRESSIBLE = ("soft-capped", "quantized inside the attention")


def _ops(model):
    return collections.Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def test_manifest_lists_every_file_small():
    names = {r["file"] for r in ROWS}
    on_disk = {p.name for p in ROOT.glob("*.onnx")}
    assert names == on_disk, f"manifest and folder differ: {sorted(names ^ on_disk)}"
    sizes = {p.name: p.stat().st_size for p in ROOT.glob("*.onnx")}
    assert max(sizes.values()) < 2 * 2**20 and sum(sizes.values()) < 15 * 2**20
    assert all(r["expected_sites"] > 0 and r["exporter_version"] for r in ROWS)
    exporters = {r["exporter"] for r in ROWS}
    assert {"tf2onnx", "paddle2onnx", "jax2onnx", "onnxconverter-common", "onnxsim", "onnxslim", "onnxruntime"} <= exporters
    opsets = {next(o.version for o in onnx.load(ROOT / n, load_external_data=False).opset_import
                   if o.domain in ("", "ai.onnx")) for n in names}
    assert {7, 9, 10, 11} <= opsets, sorted(opsets)
    assert MANIFEST.exists()


def _cases():
    for row in ROWS:
        marks = [pytest.mark.xfail(reason=WAITING[row["file"]], strict=True)] if row["file"] in WAITING else []
        yield pytest.param(row, id=row["file"], marks=marks)


@pytest.mark.parametrize("row", list(_cases()))
def test_corpus_file(row):
    model = onnx.load(ROOT / row["file"])
    result = fuse_model(model)
    found = len(result.reports)
    assert found == row["expected_sites"], f"{row['expected_sites'] - found} silent misses ({found} found)"
    for r in result.reports:
        if r.status != "fused":
            assert r.reason and any(k in r.reason for k in INEXPRESSIBLE), f"{r.site.name}: {r.reason}"
    fused = [r for r in result.reports if r.status == "fused"]
    assert fused and result.verification.get("passed") is True
    assert _ops(result.model)["Attention"] >= len(fused)


def test_qattention_is_written_as_onnx_runtime_computes_it():
    """quantize_dynamic over ORT's optimized BERT: each com.microsoft QAttention becomes an integer projection
    (MatMulInteger, int32 accumulation, scaled) and the standard Attention op; the quantized layers after it
    see the same values, so the output matches exactly."""
    model = onnx.load(ROOT / "bert.ort-optimizer-qdyn.onnx")
    assert _ops(model)["com.microsoft:QAttention"] == 2
    sites = match(model).sites
    assert [s.source for s in sites] == ["com.microsoft:QAttention"] * 2
    assert all(s.q_heads == 4 and s.head_size == 16 and s.padding for s in sites)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    ops = _ops(result.model)
    assert ops["com.microsoft:QAttention"] == 0 and ops["Attention"] == 2
    assert ops["MatMulInteger"] == _ops(model)["MatMulInteger"] + 2
    assert result.verification["max_abs_err"] <= 1e-6


@pytest.mark.parametrize("op", ["DecoderMaskedSelfAttention", "LongformerAttention", "PackedAttention",
                                "SparseAttention"])
def test_other_contrib_attention_ops_are_listed_not_silent(op):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])
    node = helper.make_node(op, ["x"], ["y"], domain="com.microsoft", num_heads=2, name="contrib")
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    (site,) = match(model).sites
    assert site.source == f"com.microsoft:{op}" and site.q_heads == 2


def test_make_regenerates_a_corpus_file(tmp_path):
    """make.py's in-environment recipes still run: the opset-7 export comes out as the manifest says."""
    pytest.importorskip("torch", reason="the corpus recipes export with torch (the `export` extra)")
    from trtattn.zoo.foreign import make, tools

    name = "plain-opset7.torchscript.onnx"
    (row,) = tools.make(tmp_path, [name])
    committed = next(r for r in ROWS if r["file"] == name)
    assert {k: row[k] for k in ("file", "exporter", "expected_sites", "exercises")} == \
        {k: committed[k] for k in ("file", "exporter", "expected_sites", "exercises")}
    model = onnx.load(tmp_path / name)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 7
    assert len(match(model).sites) == row["expected_sites"]
    (tmp_path / "manifest.json").write_text(json.dumps([row]))
    (tmp_path / name).write_bytes(b"x" * (make.MAX_FILE + 1))
    with pytest.raises(SystemExit, match="corpus files stay under"):  # make.py refuses a file over 2 MB
        make.main(["--out", str(tmp_path), "--skip-tools"])
