"""`trtattn inspect`: fused / not fused attention from engine layer info, in the shapes TensorRT publishes.

The files under tests/data/layerinfo/ follow published trtexec output (each says where its shape comes from).
Tests marked `trt` build real engines and need TensorRT and a GPU; they skip with the reason elsewhere.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA as TESTS_DATA
from trtattn import inspect as ti
from trtattn.cli import inspect as command
from trtattn.errors import MissingDependencyError, TrtattnError
from trtattn.inspect.precision import dtype_of, ran_in
from trtattn.report import Progress

DATA = TESTS_DATA / "layerinfo"


def run(capsys, *argv) -> tuple[int, str]:
    """The command as the CLI runs it: add_parser + run."""
    ap = argparse.ArgumentParser(prog="trtattn")
    command.add_parser(ap.add_subparsers(dest="command", required=True))
    code = command.run(ap.parse_args(["inspect", *map(str, argv)]), Progress(enabled=False))
    return code, capsys.readouterr().out


def report(name, sites=None) -> dict:
    return ti.classify(ti.load_layer_info(DATA / name), ti.load_sites(DATA / sites) if sites else None)


def by_site(rep) -> dict:
    return {r["site"]: r for r in rep["attention"]}


# --- classification ------------------------------------------------------------------------------------------

def test_fused_detailed_json():
    rep = report("fused_detailed.json")
    rows = by_site(rep)
    assert list(rows) == ["model/layers.0/self_attn", "model/layers.1/self_attn"]
    for r in rows.values():
        assert r["fused"] and r["status"] == "fused"
        assert r["kernel"].startswith("_gemm_mha_v2_")
        assert len(r["layers"]) == 1 and r["layers"][0].startswith("_gemm_mha_v2_myl0_")
    assert rep["other_softmax"] == []
    assert rep["summary"] == {**rep["summary"], "attention": 2, "fused": 2, "not_fused": 0, "ok": True,
                              "verbosity": "detailed"}
    # projections and MLP gemms (same module paths, sm80_xmma_gemm tactics) are not attention layers
    assert not any("proj" in layer for r in rows.values() for layer in r["layers"])


def test_unfused_detailed_json_lists_the_split_layers():
    rows = by_site(report("unfused_detailed.json"))
    assert set(rows) == {"model/layers.0/self_attn", "model/layers.1/self_attn"}
    for i, r in enumerate(rows.values()):
        assert not r["fused"] and r["status"] == "not fused" and r["kernel"] is None
        assert r["layers"][0].startswith(f"/model/layers_{i}/self_attn/MatMul_myl0_")
        assert r["layers"][1].startswith("__myl_DivAddSoftmax_myl0_")
        assert r["layers"][2].startswith(f"/model/layers_{i}/self_attn/MatMul_1_myl0_")
        assert "gemm" in r["reason"]


def test_mixed_dumplayerinfo_log_table_and_json(capsys):
    code, out = run(capsys, DATA / "mixed_dumplayerinfo.log")
    assert code == 0
    lines = out.splitlines()
    row0 = next(line for line in lines if line.startswith("model/encoder/layers.0/self_attn"))
    row1 = next(line for line in lines if line.startswith("model/encoder/layers.1/self_attn"))
    assert " fused " in row0 and "_gemm_mha_v2_0x7c5f" in row0
    assert "not fused" in row1
    assert lines[-1].startswith("2 attention site(s): 1 fused, 1 not fused; 0 other softmax; 12 layers (detailed)")

    code, out = run(capsys, DATA / "mixed_dumplayerinfo.log", "--json")
    assert code == 0
    rep = json.loads(out)
    assert [(r["site"], r["fused"]) for r in rep["attention"]] == [
        ("model/encoder/layers.0/self_attn", True), ("model/encoder/layers.1/self_attn", False)]
    assert set(rep) >= {"attention", "other_softmax", "summary"}
    assert set(rep["attention"][0]) >= {"site", "fused", "status", "proof", "layers", "kernel", "precision",
                                        "built_for"}
    assert [(r["proof"], r["precision"]) for r in rep["attention"]] == [("kernel", "fp16"), (None, "fp16")]
    assert rep["attention"][1]["layers"] == ["/model/encoder/layers_1/self_attn/MatMul_myl0_8",
                                             "__myl_AddReduMaxSubExpReduSumDiv_myl0_9",
                                             "/model/encoder/layers_1/self_attn/MatMul_1_myl0_10"]


def test_classifier_softmax_is_not_attention(capsys):
    rep = report("vit_classifier.json")
    assert [r["site"] for r in rep["attention"]] == ["vit/encoder/layer.0/attention/attention"]
    assert rep["attention"][0]["fused"]
    assert [s["name"] for s in rep["other_softmax"]] == ["/classifier/Softmax"]
    assert "not between two MatMuls" in rep["other_softmax"][0]["reason"]
    code, out = run(capsys, DATA / "vit_classifier.json", "--require-fused")
    assert code == 0
    assert "other softmax (not attention): /classifier/Softmax" in out
    assert "1 attention site(s): 1 fused" in out


def test_unscoped_dynamo_names_follow_the_tensors():
    rep = report("dynamo_dataflow.log")
    assert [(r["site"], r["fused"]) for r in rep["attention"]] == [("node_softmax", False)]
    assert rep["attention"][0]["layers"] == ["node_matmul", "node_softmax", "node_matmul_1"]
    # the lm head's softmax: fed by a MatMul, feeding none
    assert [(s["name"], s["reason"]) for s in rep["other_softmax"]] == [("node_softmax_1", "not feeding a MatMul")]


def test_names_only_json_cannot_prove_fusion():
    rep = report("names_only.json")
    rows = by_site(rep)
    assert set(rows) == {"bert/encoder/layer.0/attention/self", "bert/encoder/layer.1/attention/self"}
    assert rep["summary"]["verbosity"] == "layer_names_only"
    # layer 1's attention is one {ForeignNode[.../MatMul.../MatMul_1]} layer: mapped to its module
    assert rows["bert/encoder/layer.1/attention/self"]["layers"] == [
        "{ForeignNode[/bert/encoder/layer.1/attention/self/MatMul.../bert/encoder/layer.1/attention/self/MatMul_1]}"]
    for r in rows.values():
        assert not r["fused"] and "--profilingVerbosity=detailed" in r["reason"]
    # the reformat layer that names an output-projection MatMul does not pair with anything
    assert not any("Reformatting" in layer for r in rows.values() for layer in r["layers"])


def test_opaque_foreign_node_fails_require_fused(capsys):
    rep = report("builder_verbose.log")
    assert rep["attention"] == [] and len(rep["summary"]["opaque_layers"]) == 1
    assert run(capsys, DATA / "builder_verbose.log")[0] == 0
    code, out = run(capsys, DATA / "builder_verbose.log", "--require-fused")
    assert code == 1 and "--profilingVerbosity=detailed" in out


# --- --require-fused --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,code", [("fused_detailed.json", 0), ("unfused_detailed.json", 1),
                                       ("mixed_dumplayerinfo.log", 1), ("vit_classifier.json", 0),
                                       ("names_only.json", 1), ("dynamo_dataflow.log", 1),
                                       ("iattention_typed.log", 1), ("resnet_no_attention.json", 1),
                                       ("fp8_detailed.json", 0), ("builder_verbose.log", 1)])
def test_require_fused_exit_codes(capsys, name, code):
    assert run(capsys, DATA / name, "--require-fused")[0] == code
    assert run(capsys, DATA / name)[0] == 0  # without the flag the report is all


def test_require_fused_names_what_failed(capsys):
    code, out = run(capsys, DATA / "mixed_dumplayerinfo.log", "--require-fused")
    assert code == 1
    last = out.splitlines()[-1]
    assert last.startswith("--require-fused failed: model/encoder/layers.1/self_attn: not fused")
    assert "layers.0" not in last
    code, out = run(capsys, DATA / "mixed_dumplayerinfo.log", "--require-fused", "--json")
    assert code == 1
    summary = json.loads(out)["summary"]  # stdout stays pure JSON
    assert summary["ok"] is False and len(summary["failures"]) == 1


# --- what proves fusion: a kernel or tactic name, or the sidecar's decomposable=False -------------------------

def test_attention_layer_type_alone_is_unproven(capsys):
    """An IAttention layer with a numeric tactic says it is an attention, not that TensorRT fused it."""
    rep = report("iattention_typed.log")
    rows = by_site(rep)
    assert list(rows) == ["model/layers.0/self_attn", "model/layers.1/self_attn"]
    fused, typed = rows.values()
    assert fused == {**fused, "status": "fused", "fused": True, "proof": "kernel"}
    assert fused["kernel"].startswith("fmha_v2_flash_attention_fp16_")
    assert typed == {**typed, "status": "unproven", "fused": False, "proof": None, "kernel": None}
    assert "names no kernel or tactic" in typed["reason"] and "decomposable=False" in typed["reason"]
    assert rep["summary"] == {**rep["summary"], "attention": 2, "fused": 1, "not_fused": 0, "unproven": 1,
                              "ok": False}
    assert rep["summary"]["failures"] == [f"model/layers.1/self_attn: unproven ({typed['reason']})"]
    code, out = run(capsys, DATA / "iattention_typed.log", "--require-fused")
    assert code == 1
    assert out.splitlines()[-2].startswith("2 attention site(s): 1 fused, 0 not fused, 1 unproven;")
    assert out.splitlines()[-1].startswith("--require-fused failed: model/layers.1/self_attn: unproven")


def test_sidecar_decomposable_false_proves_a_typed_attention(capsys, tmp_path):
    rows = by_site(report("iattention_typed.log", "iattention_typed.sites.json"))
    assert [(r["status"], r["proof"]) for r in rows.values()] == [
        ("fused", "kernel"), ("fused", "sidecar: built with decomposable=False")]
    code, out = run(capsys, DATA / "iattention_typed.log", "--sites", DATA / "iattention_typed.sites.json",
                    "--require-fused")
    assert code == 0 and "(sidecar: built with decomposable=False)" in out
    assert "2 attention site(s): 2 fused, 0 not fused;" in out
    # built with decomposable=True, or a sidecar that does not say: TensorRT was free to split it
    sidecar = json.loads((DATA / "iattention_typed.sites.json").read_text())
    for value in (True, None):
        for site in sidecar["sites"]:
            site["decomposable"] = value
        path = tmp_path / "llama.json"
        path.write_text(json.dumps(sidecar))
        row = by_site(ti.inspect(DATA / "iattention_typed.log", sites=path))["model/layers.1/self_attn"]
        assert row["status"] == "unproven" and row["listed_in_sidecar"], value
        assert ("the sidecar records decomposable=True" in row["reason"]) == bool(value)
        assert run(capsys, DATA / "iattention_typed.log", "--sites", path, "--require-fused")[0] == 1
    # a kernel name is proof whatever the sidecar says
    assert by_site(ti.inspect(DATA / "iattention_typed.log", sites=path))["model/layers.0/self_attn"]["fused"]


def test_no_attention_fails_require_fused(capsys):
    """A ResNet's layer info: nothing is proven fused, so --require-fused cannot pass (its Softmax is a head)."""
    rep = report("resnet_no_attention.json")
    assert rep["attention"] == [] and rep["summary"]["opaque_layers"] == []
    assert [s["name"] for s in rep["other_softmax"]] == ["/softmax/Softmax"]
    assert rep["summary"]["failures"] == ["no attention found in 8 layer(s), so none is proven fused"]
    assert run(capsys, DATA / "resnet_no_attention.json")[0] == 0
    code, out = run(capsys, DATA / "resnet_no_attention.json", "--require-fused")
    assert code == 1 and out.splitlines()[-1] == (
        "--require-fused failed: no attention found in 8 layer(s), so none is proven fused")
    code, out = run(capsys, DATA / "resnet_no_attention.json", "--require-fused", "--json")
    assert code == 1 and json.loads(out)["summary"]["ok"] is False


# --- the precision each site ran in ---------------------------------------------------------------------------

def test_fp8_site_that_ran_in_fp16_fails_require_fused(capsys):
    """Both sites built for FP8 (sidecar) and both fused; layer 1's kernel took Half: NVIDIA/TensorRT#4516."""
    rep = report("fp8_detailed.json", "fp8.sites.json")
    rows = by_site(rep)
    assert [(r["fused"], r["precision"], r["built_for"]) for r in rows.values()] == [
        (True, "fp8", "fp8"), (True, "fp16", "fp8")]
    assert "precision_problem" not in rows["model/layers.0/self_attn"]
    problem = rows["model/layers.1/self_attn"]["precision_problem"]
    assert problem.startswith("built for fp8, ran in fp16")
    assert rep["summary"]["wrong_precision"] == ["model/layers.1/self_attn"]
    assert rep["summary"]["failures"] == [f"model/layers.1/self_attn: {problem}"]
    code, out = run(capsys, DATA / "fp8_detailed.json", "--sites", DATA / "fp8.sites.json", "--require-fused")
    assert code == 1
    table = out.splitlines()
    assert "fp16 (built fp8)" in next(line for line in table if line.startswith("model/layers.1/self_attn"))
    assert " fp8 " in next(line for line in table if line.startswith("model/layers.0/self_attn"))
    assert "1 not in the precision built for" in table[-2]
    assert table[-1] == f"--require-fused failed: model/layers.1/self_attn: {problem}"
    code, out = run(capsys, DATA / "fp8_detailed.json", "--sites", DATA / "fp8.sites.json", "--require-fused",
                    "--json")
    assert code == 1 and by_site(json.loads(out))["model/layers.1/self_attn"]["precision_problem"] == problem
    # without the sidecar nothing says FP8 was asked for: the precision is reported, not judged
    rows = by_site(report("fp8_detailed.json"))
    assert [(r["precision"], r["built_for"]) for r in rows.values()] == [("fp8", None), ("fp16", None)]
    assert run(capsys, DATA / "fp8_detailed.json", "--require-fused")[0] == 0


def test_quantized_site_without_tensor_types_is_not_taken_on_trust():
    layers = [ti.make_layer(0, "trtattn/attn/a", "kgen", "_gemm_mha_v2_0x1")]
    sites = [{"name": "a", "layer": "trtattn/attn/a", "dtype": "int8", "normalization_quantize_to_type": "int8"}]
    row = by_site(ti.classify(ti.LayerInfo("x", "json", layers), sites))["a"]
    assert row["fused"] and row["precision"] is None and "records no tensor types" in row["precision_problem"]
    sites[0].update(dtype="fp16", normalization_quantize_to_type=None)  # only quantized sites are judged
    row = by_site(ti.classify(ti.LayerInfo("x", "json", layers), sites))["a"]
    assert row["built_for"] == "fp16" and "precision_problem" not in row


@pytest.mark.parametrize("fmt,dtype", [
    ("Half", "fp16"), ("Row major linear FP16 format", "fp16"), ("Channel major FP16 format where channel % 8 == 0",
                                                                 "fp16"),
    ("BFloat16", "bf16"), ("Channel major BFloat16 format where channel % 8 == 0", "bf16"), ("FP8", "fp8"),
    ("Row major linear FP8 format", "fp8"), ("Int8", "int8"), ("Four wide channel vectorized row major Int8 format",
                                                                "int8"),
    ("Row major INT8 format where column stride % 64 == 0", "int8"), ("Float", "fp32"), ("Row major linear FP32",
                                                                                          "fp32"),
    ("Int32", "int32"), ("Row major linear Int64 format", "int64"), ("Row major linear BOOL", "bool"),
    ("Unknown format", None), ("", None)])
def test_format_datatype_names(fmt, dtype):
    """The Format/Datatype spellings of Myelin and of the long format descriptions (TREx's table)."""
    assert dtype_of(fmt) == dtype


def test_ran_in_reads_the_attention_layers_operands():
    def layer(name, ltype, tactic, ins, outs):
        return ti.make_layer(0, name, ltype, tactic, input_formats=ins, output_formats=outs)

    # an FP8 kernel writes Half; a wider mask does not widen it; lengths are no compute type
    fp8 = layer("k", "kgen", "_gemm_mha_v2_0x1", ["FP8", "FP8", "FP8", "Half", "Int32"], ["Half"])
    assert ran_in([layer("q_scale", "kgen", None, ["Half"], ["FP8"]), fp8]) == "fp8"
    # unfused: the MatMuls' operands; a layer that gives only outputs; a layer with no types
    gemms = [layer("/a/MatMul", "gemm", "sm80_xmma_gemm_f16", ["Half", "Half"], ["Half"]),
             layer("/a/Softmax", "kgen", None, ["Float"], ["Float"])]
    assert ran_in(gemms) == "fp16"
    assert ran_in([layer("trtattn/attn/a", "Attention", None, [], ["BFloat16"])]) == "bf16"
    assert ran_in([layer("trtattn/attn/a", "Attention", None, ["Int32"], [])]) is None


def test_tensor_types_from_every_shape():
    oneline = ti.load_layer_info(DATA / "mixed_dumplayerinfo.log").layers[4]
    assert oneline.name == "_gemm_mha_v2_myl0_4" and oneline.input_dtypes == ["fp16"] * 4
    typed = next(layer for layer in ti.load_layer_info(DATA / "iattention_typed.log").layers
                 if layer.type == "Attention")
    assert typed.input_dtypes == ["fp16"] * 3 and typed.output_dtypes == ["fp16"]
    head = ti.load_layer_info(DATA / "resnet_no_attention.json").layers[-1]
    assert head.input_dtypes == ["fp16"] and head.output_dtypes == ["fp32"]
    myelin, reformat = ti.load_layer_info(DATA / "builder_verbose.log").layers
    assert myelin.inputs == ["concat_ids", "concat_mask", "sent_ids", "pos_ids"]
    assert myelin.input_dtypes == ["int32", "bool", "int32", "int32"] and myelin.output_dtypes == ["fp16"]
    assert reformat.outputs == ["logits"] and reformat.output_dtypes == ["fp32"]
    assert ti.load_layer_info(DATA / "names_only.json").layers[0].input_dtypes == []


# --- sidecar mapping -----------------------------------------------------------------------------------------------

def test_sidecar_maps_iattention_sites(capsys):
    rep = report("iattention_detailed.json", "iattention.sites.json")
    # the library call: the sidecar by its path or by its sites
    assert ti.inspect(DATA / "iattention_detailed.json", sites=DATA / "iattention.sites.json") == rep
    assert ti.inspect(DATA / "iattention_detailed.json", sites=ti.load_sites(DATA / "iattention.sites.json")) == rep
    rows = by_site(rep)
    assert list(rows) == ["model/layers.0/self_attn", "model/layers.1/self_attn"]
    assert all(r["fused"] and r["listed_in_sidecar"] for r in rows.values())
    # layer 0: kernel named by Myelin, site from the IAttention metadata (trtattn site=...); layer 1: kernel
    # named after the IAttention layer; both after their Q pre-scale layer (trtattn/attn/<site>/q_scale)
    assert rows["model/layers.0/self_attn"]["layers"] == ["__myl_Mul_myl0_5", "_gemm_mha_v2_myl0_6"]
    assert rows["model/layers.1/self_attn"]["layers"] == ["__myl_Mul_myl0_15",
                                                          "trtattn/attn/model/layers_1/self_attn_myl0_16"]
    code, out = run(capsys, DATA / "iattention_detailed.json", "--sites", DATA / "iattention.sites.json",
                    "--require-fused")
    assert code == 0 and "2 attention site(s): 2 fused, 0 not fused" in out


def test_iattention_sites_are_found_without_the_sidecar():
    rows = by_site(report("iattention_detailed.json"))
    assert list(rows) == ["model/layers.0/self_attn", "model/layers.1/self_attn"]
    assert all(r["fused"] and not r["listed_in_sidecar"] for r in rows.values())


def test_sidecar_site_missing_from_the_layer_info_fails(capsys, tmp_path):
    sidecar = json.loads((DATA / "iattention.sites.json").read_text())
    sidecar["sites"].append({"name": "model/layers.2/self_attn", "layer": "trtattn/attn/model/layers.2/self_attn"})
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(sidecar))
    code, out = run(capsys, DATA / "iattention_detailed.json", "--sites", path, "--json", "--require-fused")
    assert code == 1
    rep = json.loads(out)
    missing = by_site(rep)["model/layers.2/self_attn"]
    assert missing == {**missing, "fused": False, "status": "missing", "layers": [], "kernel": None}
    assert rep["summary"]["missing"] == ["model/layers.2/self_attn"]
    assert rep["summary"]["failures"] == [
        "model/layers.2/self_attn: listed in the sidecar but not found in the layer info"]
    code, out = run(capsys, DATA / "iattention_detailed.json", "--sites", path, "--require-fused")
    assert code == 1 and "model/layers.2/self_attn: listed in the sidecar but not found" in out.splitlines()[-1]


def test_decomposed_iattention_is_not_fused(tmp_path):
    """A site whose IAttention fell back to primitive layers (decomposable) shows gemms under its name."""
    data = json.loads((DATA / "iattention_detailed.json").read_text(), strict=False)
    kernel = next(layer for layer in data["Layers"] if layer["Name"].startswith("trtattn/attn/model/layers_1"))
    at = data["Layers"].index(kernel)
    data["Layers"][at:at + 1] = [
        {**kernel, "Name": "trtattn/attn/model/layers_1/self_attn_myl0_16", "LayerType": "gemm",
         "TacticName": "sm80_xmma_gemm_f16f16_f16f32_f32_nt_n_tilesize64x64x64_stage4_warpsize2x2x1_tensor16x8x16"},
        {**kernel, "Name": "__myl_ReduMaxSubExpReduSumDiv_myl0_17", "LayerType": "kgen",
         "TacticName": "__myl_bb0_9_ResMaxSubExpResSumDiv"},
        {**kernel, "Name": "trtattn/attn/model/layers_1/self_attn_myl0_18", "LayerType": "gemm",
         "TacticName": "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize64x32x64_stage5_warpsize2x2x1_tensor16x8x16"}]
    path = tmp_path / "decomposed.json"
    path.write_text(json.dumps(data))
    rep = ti.classify(ti.load_layer_info(path), ti.load_sites(DATA / "iattention.sites.json"))
    row = by_site(rep)["model/layers.1/self_attn"]
    assert not row["fused"] and row["layers"] == ["__myl_Mul_myl0_15", "trtattn/attn/model/layers_1/self_attn_myl0_16",
                                                  "__myl_ReduMaxSubExpReduSumDiv_myl0_17",
                                                  "trtattn/attn/model/layers_1/self_attn_myl0_18"]
    assert by_site(rep)["model/layers.0/self_attn"]["fused"]
    assert rep["summary"]["failures"] == [f"model/layers.1/self_attn: not fused ({row['reason']})"]


def test_iattention_support_layers_belong_to_their_site():
    """Layers named trtattn/attn/<site>/<role> (lower.py's q_heads, q_scale, mask_cast ...) are the site's, with or
    without the `trtattn site=` metadata or a sidecar: never sites of their own."""
    for meta in ("trtattn site=enc/l0/attn onnx=/enc/l0/attn/Softmax", ""):
        layers = [ti.make_layer(0, "trtattn/attn/enc/l0/attn/q_heads", "Shuffle"),
                  ti.make_layer(1, "trtattn/attn/enc/l0/attn/q_scale", "kgen"),
                  ti.make_layer(2, "trtattn/attn/enc/l0/attn", "kgen", "_gemm_mha_v2_0x1", meta),
                  ti.make_layer(3, "trtattn/attn/enc/l0/attn/mask_cast+trtattn/attn/enc/l1/attn/q_scale", "kgen"),
                  ti.make_layer(4, "trtattn/attn/enc/l1/attn", "gemm", "sm80_xmma_gemm_f16", meta.replace("l0", "l1"))]
        rep = ti.classify(ti.LayerInfo("x", "json", layers))
        assert [(r["site"], r["fused"], len(r["layers"])) for r in rep["attention"]] == [
            ("enc/l0/attn", True, 4), ("enc/l1/attn", False, 2)], meta
    # names only: an IAttention and its support layers inside one Myelin layer, named by its ends
    layer = ti.make_layer(0, "{ForeignNode[trtattn/attn/enc/l0/attn/q_heads...trtattn/attn/enc/l0/attn]}",
                          detailed=False)
    rep = ti.classify(ti.LayerInfo("x", "json", [layer]))
    assert [(r["site"], r["fused"]) for r in rep["attention"]] == [("enc/l0/attn", False)]
    assert "--profilingVerbosity=detailed" in rep["attention"][0]["reason"]


@pytest.mark.parametrize("layer_type,fused", [("Attention", True), ("MHA", True), ("AttentionInput", False),
                                              ("ATTENTION_OUTPUT", False), ("gemm", False)])
def test_attention_layer_types(layer_type, fused):
    assert (ti.make_layer(0, "trtattn/attn/a", layer_type).evidence is not None) == fused


# --- the shapes of the layer info ------------------------------------------------------------------------------

def test_raw_control_characters_as_tensorrt_8_6_writes_them(tmp_path):
    """TensorRT 8.6 put raw \\x1e between metadata records (NVIDIA/TensorRT#2779): invalid for strict JSON."""
    text = ('{"Layers": [{"Name": "_gemm_mha_v2_myl0_3", "LayerType": "kgen", "Inputs": [], "Outputs": [], '
            '"TacticName": "_gemm_mha_v2_0x1", "Metadata": "[ONNX Layer: /a/MatMul]\x1e[ONNX Layer: /a/Softmax]'
            '\x1e[ONNX Layer: /a/MatMul_1]"}], "Bindings": []}')
    path = tmp_path / "li.json"
    path.write_text(text)
    layer = ti.load_layer_info(path).layers[0]
    assert layer.onnx == ["/a/MatMul", "/a/Softmax", "/a/MatMul_1"]
    assert by_site(ti.classify(ti.load_layer_info(path)))["a"]["fused"]


@pytest.mark.parametrize("name", ["mixed_dumplayerinfo.log", "dynamo_dataflow.log", "builder_verbose.log",
                                  "iattention_typed.log"])
def test_logs_as_trtexec_writes_them(tmp_path, name):
    """The fixtures' comment lines removed: a log starts with `&&&& RUNNING` or `[11/21/2025-05:20:11] [I] ...`."""
    raw = tmp_path / name
    raw.write_text("".join(line for line in (DATA / name).read_text().splitlines(True) if not line.startswith("#")))
    assert raw.read_text()[0] in "&["
    assert ti.classify(ti.load_layer_info(raw))["attention"] == report(name)["attention"]


def test_oneline_fields_with_nested_brackets_and_commas():
    line = ("Name: PWN(node_Mul_20, node_Where_24), LayerType: PointWiseV2, Inputs: [ { Name: (Unnamed Layer* 689) "
            "[Shuffle]_output, Location: Device, Dimensions: [1,1,1], Format/Datatype: Row major linear FP32 }, "
            "{ Name: b, Location: Device, Dimensions: [2,3], Format/Datatype: Half }], Outputs: [ { Name: c, "
            "Dimensions: [2,3], Format/Datatype: Half }], Weights: {\"Type\": \"Int8\", \"Count\": 864}, "
            "TacticName: sm80_xmma_fmha_v2_kernel, TacticValue: 0x9ae0c0d2fb3a01e5, StreamId: 0, "
            "Metadata: [ONNX Layer: /x/Mul, odd][ONNX Layer: /x/Where]")
    layer = ti.parse_layer_info_log("Layers:\n" + line + "\n").layers[0]
    assert layer.name == "PWN(node_Mul_20, node_Where_24)" and layer.type == "PointWiseV2"
    assert layer.inputs == ["(Unnamed Layer* 689) [Shuffle]_output", "b"] and layer.outputs == ["c"]
    assert layer.tactic == "sm80_xmma_fmha_v2_kernel" and layer.kernel == layer.tactic
    assert layer.onnx == ["/x/Mul, odd", "/x/Where"]


@pytest.mark.parametrize("name,fused", [
    ("_gemm_mha_v2_myl0_17", True), ("fmha_v2_flash_attention_fp16_64_64", True), ("sm90_fmha_kernel", True),
    ("/encoder/layers_2/mha/attn/mha_prob/key/MatMul+/encoder/layers_2/mha/attn/value/MatMul_myl0_16", False),
    ("{ForeignNode[/model/mha/MatMul.../model/mha/MatMul_1]}", False), ("__myl_DivAddSoftmax_myl0_6", False),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n", False)])
def test_kernel_evidence_is_never_a_module_name(name, fused):
    """ONNX module paths such as /encoder/mha/... (NVIDIA/TensorRT#4397) are no evidence of an mha kernel."""
    assert (ti.make_layer(0, name, "kgen").kernel is not None) == fused


def test_import_does_not_load_tensorrt():
    code = "import sys, trtattn.inspect, trtattn.cli.inspect; print('tensorrt' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- bad input: one line ---------------------------------------------------------------------------------------

def _bad(tmp_path):
    files = {"missing": tmp_path / "nope.json", "directory": tmp_path / "adir.json", "empty": tmp_path / "empty.json",
             "truncated_json": tmp_path / "truncated.json", "no_layers": tmp_path / "nolayers.json",
             "bad_layer": tmp_path / "badlayer.json", "text": tmp_path / "notes.log", "onnx": tmp_path / "model.onnx"}
    files["directory"].mkdir()
    files["empty"].write_text("  \n")
    full = (DATA / "fused_detailed.json").read_text()
    files["truncated_json"].write_text(full[: len(full) // 2])
    files["no_layers"].write_text('{"Bindings": ["x"]}')
    files["bad_layer"].write_text('{"Layers": [{"LayerType": "gemm"}]}')
    files["text"].write_text("[I] Starting inference\n[I] Throughput: 1234 qps\n")
    files["onnx"].write_bytes(b"\x08\x07\x12\x07pytorch")
    return files


@pytest.mark.parametrize("kind,message", [
    ("missing", "no such file"), ("directory", "is a directory"), ("empty", "is empty"),
    ("truncated_json", "is not valid JSON"), ("no_layers", 'has no "Layers" list'),
    ("bad_layer", "neither a name nor a record"), ("text", "contains no layer information"),
    ("onnx", "is an ONNX model")])
def test_bad_layer_info_is_one_line(tmp_path, kind, message):
    path = _bad(tmp_path)[kind]
    with pytest.raises(TrtattnError) as e:
        ti.load_layer_info(path)
    text = str(e.value)
    assert message in text and path.name in text and "\n" not in text


@pytest.mark.parametrize("content,message", [(None, "no such sidecar file"), ("{not json", "is not valid JSON"),
                                             ('{"engine": "x"}', 'no "sites" list'),
                                             ('{"sites": [{"layer": "x"}]}', 'no "sites" list')])
def test_bad_sidecar_is_one_line(tmp_path, content, message):
    path = tmp_path / "llama.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TrtattnError) as e:
        ti.load_sites(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_garbled_input_through_the_command_is_one_line_exit_2(tmp_path):
    path = _bad(tmp_path)["truncated_json"]
    proc = subprocess.run([sys.executable, "-m", "trtattn", "inspect", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trtattn: error: ") and "truncated.json" in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


def _tensorrt_importable() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(_tensorrt_importable(), reason="tensorrt is importable here, so the no-TensorRT message "
                                                    "cannot be shown")
def test_engine_without_tensorrt_says_what_to_do_instead(tmp_path):
    path = tmp_path / "llama.engine"
    path.write_bytes(b"ftrt\x00\x00\x01\x02" * 64)
    with pytest.raises(MissingDependencyError) as e:
        ti.load_layer_info(path)
    text = str(e.value)
    assert "needs TensorRT" in text and "--exportLayerInfo" in text and "--dumpLayerInfo" in text
    assert "\n" not in text and text.count(". ") == 0  # one sentence


@pytest.mark.conformance
def test_read_engine_uses_only_what_the_real_bindings_have(monkeypatch, tmp_path):
    """read_engine's TensorRT calls, checked by name against the real 11.x bindings; the engine itself is a
    stand-in that returns a published-shape layer info (nothing of TensorRT is executed here)."""
    loader = pytest.importorskip("trtsim.bindings", reason="tests/trtsim (the real-bindings loader) is not here")
    real = loader.load_bindings(tmp_path / "trtsim")
    if real is None:
        pytest.skip(f"real TensorRT bindings unavailable: {loader.unavailable_reason}")
    for owner, member in [(real, "Runtime"), (real.Runtime, "deserialize_cuda_engine"), (real, "Logger"),
                          (real.Logger, "ERROR"), (real.ICudaEngine, "create_engine_inspector"),
                          (real.ICudaEngine, "profiling_verbosity"), (real.EngineInspector, "get_engine_information"),
                          (real.LayerInformationFormat, "JSON"), (real.ProfilingVerbosity, "NONE"),
                          (real.ProfilingVerbosity, "DETAILED")]:
        assert hasattr(owner, member), f"{owner.__name__}.{member} is not in TensorRT {real.__version__}"
    text = (DATA / "fused_detailed.json").read_text()

    class Inspector:
        def get_engine_information(self, fmt):
            assert fmt == real.LayerInformationFormat.JSON
            return text

    class Engine:
        def __init__(self, verbosity):
            self.profiling_verbosity = verbosity

        def create_engine_inspector(self):
            return Inspector()

    class Runtime:
        def __init__(self, logger):
            assert logger.severity == real.Logger.ERROR

        def deserialize_cuda_engine(self, data):
            return {b"E": Engine(real.ProfilingVerbosity.DETAILED), b"N": Engine(real.ProfilingVerbosity.NONE)}.get(
                bytes(data[:1]))

    class Logger:
        ERROR = real.Logger.ERROR

        def __init__(self, severity):
            self.severity = severity

    fake = type("tensorrt", (), {"__version__": real.__version__, "Runtime": Runtime, "Logger": Logger,
                                 "LayerInformationFormat": real.LayerInformationFormat,
                                 "ProfilingVerbosity": real.ProfilingVerbosity})
    from trtattn.trt import compat

    monkeypatch.setattr(compat, "import_tensorrt", lambda: fake)
    for first, expect in [(b"E", None), (b"N", "profiling verbosity NONE"), (b"X", "could not deserialize")]:
        path = tmp_path / "m.engine"
        path.write_bytes(first + b"\x00" * 64)
        if expect is None:
            info = ti.load_layer_info(path)
            assert info.format == "engine" and info.tensorrt == real.__version__
            assert [r["fused"] for r in ti.classify(info)["attention"]] == [True, True]
        else:
            with pytest.raises(TrtattnError, match=expect):
                ti.load_layer_info(path)


# --- real engines (TensorRT and a GPU) ---------------------------------------------------------------------------

@pytest.fixture
def trt():
    try:
        import tensorrt
    except Exception as e:
        pytest.skip(f"tensorrt cannot be imported here ({type(e).__name__}: {e}); run in the docker/ container")
    return tensorrt


@pytest.fixture
def builder(trt):
    try:
        b = trt.Builder(trt.Logger(trt.Logger.ERROR))
    except Exception as e:  # no CUDA device for TensorRT
        pytest.skip(f"TensorRT cannot create a builder here, no usable GPU ({' '.join(str(e).split())})")
    if b is None:
        pytest.skip("TensorRT cannot create a builder here (no usable GPU)")
    return b


def _network(trt, builder):
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder.create_network(flags)


def _build(trt, builder, network, path) -> Path:
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    plan = builder.build_serialized_network(network, config)
    assert plan is not None, "TensorRT failed to build the test network"
    path.write_bytes(bytes(plan))
    return path


@pytest.mark.trt
def test_iattention_engine_is_fused(trt, builder, tmp_path, capsys):
    """One IAttention named and tagged the way trtattn build does: fused, found through the sidecar."""
    network = _network(trt, builder)
    shape = (1, 8, 128, 64)
    q, k, v = (network.add_input(n, trt.DataType.HALF, shape) for n in "qkv")
    attn = network.add_attention_v2(q, k, v, trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.NONE)
    attn.name = "trtattn/attn/toy/self_attn"  # as trtattn/trt/lower.py names and tags it
    attn.metadata = "trtattn site=toy/self_attn onnx=/toy/self_attn/Softmax"
    out = attn.get_output(0)
    out.name = "out"
    network.mark_output(out)
    engine = _build(trt, builder, network, tmp_path / "toy.engine")
    sidecar = tmp_path / "toy.json"
    sidecar.write_text(json.dumps({"sites": [{"name": "toy/self_attn", "layer": "trtattn/attn/toy/self_attn"}]}))
    code, out = run(capsys, engine, "--sites", sidecar, "--require-fused", "--json")
    rep = json.loads(out)
    assert code == 0, rep
    assert [(r["site"], r["fused"]) for r in rep["attention"]] == [("toy/self_attn", True)]
    assert rep["format"] == "engine" and rep["summary"]["verbosity"] == "detailed"


@pytest.mark.trt
def test_primitive_attention_engine_is_found(trt, builder, tmp_path):
    """MatMul -> Softmax -> MatMul built from primitive layers tagged like the ONNX parser tags them; a head's
    softmax after it is not attention. Whether TensorRT fuses the attention is its choice: both are reported."""
    import numpy as np

    network = _network(trt, builder)
    shape = (1, 8, 128, 64)
    q, k, v = (network.add_input(n, trt.DataType.HALF, shape) for n in "qkv")

    def tag(layer, onnx_name):
        layer.name = onnx_name
        layer.metadata = f"[ONNX Layer: {onnx_name}]"
        return layer.get_output(0)

    s = tag(network.add_matrix_multiply(q, trt.MatrixOperation.NONE, k, trt.MatrixOperation.TRANSPOSE),
            "/toy/self_attn/MatMul")
    sm = network.add_softmax(s)
    sm.axes = 1 << 3
    p = tag(sm, "/toy/self_attn/Softmax")
    ctx = tag(network.add_matrix_multiply(p, trt.MatrixOperation.NONE, v, trt.MatrixOperation.NONE),
              "/toy/self_attn/MatMul_1")
    w = network.add_constant((1, 1, 64, 10), trt.Weights(np.full((1, 1, 64, 10), 0.01, dtype=np.float16)))
    logits = tag(network.add_matrix_multiply(ctx, trt.MatrixOperation.NONE, w.get_output(0),
                                             trt.MatrixOperation.NONE), "/head/MatMul")
    head = network.add_softmax(logits)
    head.axes = 1 << 3
    probs = tag(head, "/head/Softmax")
    probs.name = "probs"
    network.mark_output(probs)
    engine = _build(trt, builder, network, tmp_path / "primitive.engine")
    rep = ti.classify(ti.load_layer_info(engine))
    assert [r["site"] for r in rep["attention"]] == ["toy/self_attn"], rep
    assert [s["name"] for s in rep["other_softmax"]] == ["/head/Softmax"], rep


@pytest.mark.trt
def test_garbage_engine_is_one_line(trt, tmp_path):
    path = tmp_path / "garbage.engine"
    path.write_bytes(b"\x00not an engine\x00" * 100)
    with pytest.raises(TrtattnError) as e:
        ti.load_layer_info(path)
    assert "garbage.engine" in str(e.value) and "\n" not in str(e.value)
