"""`trtattn fuse --ops trt`: every site of the build form as TensorRT's own ONNX op (trt::TRT_Attention,
TRT_KVCacheUpdate), exactly as documented (trtattn_plugins.schema), verified on CPU through trtattn_plugins'
kernels; the sidecar with the trtexec shapes; the CLI. (Every zoo model x form: benchmarks/trt_route.py.)"""

import collections
import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import trtattn_plugins as tp
from trtattn.cli import main
from trtattn.errors import TrtattnError
from trtattn.routes.trt_ops import (
    TrtOpRow,
    fuse_trt,
    shape_strings,
    verify_trt_ops,
    write_trt_ops,
)
from trtattn.trt.plan import AttentionPlan, BuildPlan
from trtattn.trt.profiles import parse_shapes

CASES = [("llama", "torchscript", "padded"), ("bert", "dynamo", "packed"), ("llama-cache", "torchscript", "kv-cache"),
         ("bert-foreign-dims", "dynamo", "packed"),  # batch and heads merged: [N, 1, T, H] tokens
         ("llama-cache-sdpa", "dynamo", "kv-cache")]  # the past concatenated in front of an ONNX Attention op
_results = {}


@pytest.fixture
def fused_for_trt(zoo_export):
    """A zoo export and fuse_trt's result on it (its TensorRT-op model, plan and check), made once per model and form."""
    def get(name, exporter, form):
        if (name, exporter, form) not in _results:
            model = onnx.load(str(zoo_export(name, exporter)))
            # fp32 keeps the check tight (1e-4); the CLI test below takes the default fp16
            _results[name, exporter, form] = (model, fuse_trt(model, name=name, form=form, precision="fp32"))
        return _results[name, exporter, form]
    return get


def trt_nodes(model, op=None):
    return [n for n in model.graph.node if n.domain == "trt" and (op is None or n.op_type == op)]


def attrs(node):
    return {a.name: (v.decode() if isinstance(v := onnx.helper.get_attribute_value(a), bytes) else v)
            for a in node.attribute}


@pytest.mark.parametrize("name,exporter,form", CASES)
def test_zoo_form_written_as_documented_trt_ops_and_verified(fused_for_trt, name, exporter, form):
    _, result = fused_for_trt(name, exporter, form)
    plan, out = result.prepared.plan, result.model
    assert result.ok and result.verification.max_abs_err <= 1e-4, result.verification
    assert tp.check_model(out) == []
    assert not [n for n in out.graph.node if n.op_type in ("Attention", "TensorScatter", "ScatterND")]
    assert [o.domain for o in out.opset_import if o.domain == "trt"] == ["trt"]
    producers = {o: n for n in out.graph.node for o in n.output}
    init_values = {i.name: onnx.numpy_helper.to_array(i) for i in out.graph.initializer}
    attentions = {n.name: n for n in trt_nodes(out, "TRT_Attention")}
    assert sorted(attentions) == sorted(a.layer for a in plan.native) and len(attentions) == len(plan.attentions)
    for a in plan.native:
        node = attentions[a.layer]
        expect = {"query_form": f"{a.query_form}_" + ("bhnd" if a.query_form == "padded" else "nhd"),
                  "kv_form": f"{a.kv_form}_" + ("bhnd" if a.kv_form == "padded" else "nhd"),
                  "causal_kind": a.causal, "TRT_decomposable": 0}
        assert attrs(node) == expect
        q = producers[node.input[0]]
        while q.op_type != "Mul":  # Q is pre-scaled by the softmax scale (then packed, where packed)
            q = producers[q.input[0]]
        scale = next(init_values[i] for i in q.input if i in init_values)
        assert float(scale) == pytest.approx(a.q_scale)
        lengths = list(node.input[4:6])
        assert len(set(filter(None, lengths))) == len([x for x in lengths if x])  # never one tensor for both
    updates = trt_nodes(out, "TRT_KVCacheUpdate")
    assert len(updates) == len(plan.cache_updates)
    assert sum(n.op_type == "RotaryEmbedding" for n in out.graph.node) == len(plan.ropes)
    if form == "kv-cache":
        assert plan.aliases and updates
        capacity = plan.limits.max_cache
        declared = {v.name: v.type.tensor_type.shape.dim for v in [*out.graph.input, *out.graph.output]}
        for c in plan.cache_updates:  # TensorRT's KV-cache layer wants a static capacity
            assert declared[c.cache][2].dim_value == capacity and declared[c.output][2].dim_value == capacity
        assert {attrs(n)["update_form"] for n in updates} == {"packed_nhd"}


def test_verification_runs_the_trt_ops(fused_for_trt):
    """A wrong causal kind in the written ops fails the same check (the CPU kernels really run)."""
    _, result = fused_for_trt("llama", "torchscript", "padded")
    broken = onnx.ModelProto()
    broken.CopyFrom(result.model)
    for node in trt_nodes(broken, "TRT_Attention"):
        for a in node.attribute:
            if a.name == "causal_kind":
                a.s = b"none"
    outcome = verify_trt_ops(broken, result.prepared)
    assert not outcome.passed and outcome.max_abs_err > 1e-2


def test_sidecar_gives_trtexec_the_profiles(fused_for_trt, tmp_path):
    _, result = fused_for_trt("llama-cache", "torchscript", "kv-cache")
    info = result.sidecar(tmp_path / "llama-cache.trt.onnx")
    plan = result.prepared.plan
    assert info["route"] == "trtexec" and info["ops"] == ["trt::TRT_Attention", "trt::TRT_KVCacheUpdate"]
    assert [s["layer"] for s in info["sites"]] == [a.layer for a in plan.attentions]
    assert info["io"]["aliases"] == plan.aliases
    (shapes,) = info["trtexec"]["shapes"]
    for key, flag in (("min", "--minShapes"), ("opt", "--optShapes"), ("max", "--maxShapes")):
        assert parse_shapes(shapes[flag]) == {n: tuple(row[key]) for n, row in plan.profiles[0].items()}
        assert f"{flag}={shapes[flag]}" in info["trtexec"]["command"]
    assert {"--stronglyTyped", "--profilingVerbosity=detailed"} <= set(info["trtexec"]["command"])
    inputs = {i["name"]: i for i in info["io"]["inputs"]}
    assert all(inputs[c]["shape"][2] == plan.limits.max_cache for c in plan.aliases.values())


def test_sidecar_names_output_dims_after_the_inputs_dims_as_the_engine_does(fused_for_trt, tmp_path):
    """TorchScript names Llama's output dim 'Mullast_hidden_state_dim_1'; the plan proves it the inputs' 'seq'
    (trt/plan.named_outputs) and the sidecar says so, as build's engine sidecar does."""
    _, result = fused_for_trt("llama", "torchscript", "padded")
    written = {o.name: o for o in result.model.graph.output}["last_hidden_state"]
    assert [d.dim_param or d.dim_value for d in written.type.tensor_type.shape.dim][1] != "seq"  # the exporter's name
    info = result.sidecar(tmp_path / "llama.trt.onnx")
    assert {o["name"]: o["shape"] for o in info["io"]["outputs"]}["last_hidden_state"] == ["batch", "seq", 64]


def test_rows_are_typed_one_per_site_and_their_json_keeps_the_reports_keys(fused_for_trt):
    _, result = fused_for_trt("llama", "torchscript", "padded")
    rows, plan = result.rows(), result.prepared.plan
    assert all(isinstance(r, TrtOpRow) for r in rows)
    assert [(r.name, r.node, r.op) for r in rows] == [(a.site, a.layer, "TRT_Attention") for a in plan.attentions]
    assert [(r.heads, r.form) for r in rows] == [(f"{a.q_heads}/{a.kv_heads}", "padded_bhnd") for a in plan.attentions]
    assert list(rows[0].to_json()) == ["name", "op", "node", "form", "heads", "head_size", "q_scale", "causal_kind",
                                       "mask", "lengths", "dtype", "quantize", "reason"]
    assert json.loads(json.dumps(rows[0].to_json()))["reason"] is None


def test_shape_strings_quote_names_with_separators():
    profiles = [{"a:0": {"min": [1, 2], "opt": [2, 4], "max": [4, 8]}, "b": {"min": [1], "opt": [1], "max": [3]}}]
    assert shape_strings(profiles) == [{"--minShapes": "'a:0':1x2,b:1", "--optShapes": "'a:0':2x4,b:1",
                                        "--maxShapes": "'a:0':4x8,b:3"}]


def test_cli_writes_model_and_sidecar_and_verify_reads_it(zoo_export, tmp_path, capsys):
    src = zoo_export("vit", "torchscript")
    out = tmp_path / "vit.trt.onnx"
    report = tmp_path / "report.json"
    assert main(["-q", "fuse", str(src), "-o", str(out), "--ops", "trt", "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "TRT_Attention" in printed and "trtexec --onnx=" in printed
    info = json.loads((tmp_path / "vit.trt.json").read_text())
    assert info["verification"]["passed"] and len(info["sites"]) == 2
    data = json.loads(report.read_text())
    assert data["ops"] == "trt" and data["output"] == str(out) and [s["op"] for s in data["sites"]] == ["TRT_Attention"] * 2
    written_model = onnx.load(str(out))
    assert tp.check_model(written_model) == [] and len(trt_nodes(written_model, "TRT_Attention")) == 2
    assert info["precision"] == "fp16" and {s["dtype"] for s in info["sites"]} == {"fp16"}
    assert main(["-q", "verify", str(out), "--onnx", str(src), "--sidecar", str(tmp_path / "vit.trt.json")]) == 0
    assert "passed" in capsys.readouterr().out


def test_cli_form_needs_ops_trt(zoo_export, tmp_path, capsys):
    src = zoo_export("vit", "torchscript")
    assert main(["-q", "fuse", str(src), "-o", str(tmp_path / "x.onnx"), "--form", "packed"]) == 2
    assert "--ops trt" in capsys.readouterr().err


def test_sites_trt_ops_cannot_express_are_named_not_written(fused_for_trt):
    """A site the plan keeps out of IAttention (Gemma 2's soft-capped logits: plan.reason) is refused by name;
    nothing is written (benchmarks/trt_route.py runs Gemma 2 itself)."""
    _, result = fused_for_trt("llama", "torchscript", "padded")
    plan = result.prepared.plan
    capped = replace(plan.attentions[1], reason="its logits are soft-capped (tanh), which IAttention cannot do")
    refused = replace(plan, attentions=[plan.attentions[0], capped])
    with pytest.raises(TrtattnError, match=rf"1 site\(s\) .*{capped.site}: its logits are soft-capped"):
        write_trt_ops(SimpleNamespace(plan=refused, form_model=result.prepared.form_model))


def _qdq(name, scale, dtype=TensorProto.INT8):
    zero = helper.make_tensor(f"{name}_zero", dtype, [], [0])
    s = helper.make_tensor(f"{name}_scale", TensorProto.FLOAT, [], [scale])
    nodes = [helper.make_node("QuantizeLinear", [name, s.name, zero.name], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", s.name, zero.name], [f"{name}_dq"])]
    return nodes, [zero, s]


def test_quantized_softmax_becomes_trt_quantized_attention():
    """A plan that quantizes the softmax output (int8) writes TRT_QuantizedAttention with Attention-23's scale
    (Q/DQ on Q, K, V stay ordinary nodes right in front) and matches the same math in standard ONNX ops."""
    b, n, s, h, p_scale = 2, 2, 5, 16, 1 / 127
    io = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [b, n, s, h]) for x in "qkv"]
    nodes, inits = [], []
    for x in "qkv":
        more, c = _qdq(x, 0.05)
        nodes += more
        inits += c
    nodes.append(helper.make_node("Attention", ["q_dq", "k_dq", "v_dq"], ["y"], name="attn", scale=0.25))
    form = helper.make_model(helper.make_graph(nodes, "g", io, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                               [b, n, s, h])], inits),
                             opset_imports=[helper.make_opsetid("", 23)])
    plan = BuildPlan("x", "padded", "int8", attentions=[AttentionPlan(
        "site", "attn", "trtattn/attn/site", "q_dq", "k_dq", "v_dq", "y", 0.25, causal="upper_left", q_heads=n,
        kv_heads=n, head_size=h, dtype="int8", normalization_quantize_to_type="int8",
        normalization_quantize_scale=p_scale, region=("attn",))])
    written = write_trt_ops(SimpleNamespace(plan=plan, form_model=form))
    (node,) = trt_nodes(written)
    assert node.op_type == "TRT_QuantizedAttention" and list(node.input[:3]) == ["q_dq", "k_dq", "v_dq"]
    assert attrs(node) == {"query_form": "padded_bhnd", "kv_form": "padded_bhnd", "is_causal": 1, "scale": 0.25,
                           "normalization_quantize_to_type": TensorProto.INT8, "TRT_decomposable": 0}
    assert tp.check_model(written) == []
    # the same in standard ops: causal softmax(Q K^T * 0.25), its int8 Q/DQ, then P V
    ref_nodes = nodes[:-1] + [
        helper.make_node("Transpose", ["k_dq"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_dq", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "quarter"], ["logits"]),
        helper.make_node("Add", ["logits", "causal"], ["masked"]), helper.make_node("Softmax", ["masked"], ["p"]),
        *_qdq("p", p_scale)[0], helper.make_node("MatMul", ["p_dq", "v_dq"], ["y"])]
    causal = np.triu(np.full((s, s), -np.inf, np.float32), 1)
    ref_inits = inits + _qdq("p", p_scale)[1] + [onnx.numpy_helper.from_array(np.float32(0.25), "quarter"),
                                                 onnx.numpy_helper.from_array(causal, "causal")]
    ref = helper.make_model(helper.make_graph(ref_nodes, "r", io, list(form.graph.output), ref_inits),
                            opset_imports=[helper.make_opsetid("", 21)])
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((b, n, s, h)).astype(np.float32) for x in "qkv"}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep its Q/DQ where they are
    want = ort.InferenceSession(ref.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = tp.Session(written).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_fully_masked_query_rows_stay_uniform_in_fp16(zoo_export):
    """DeBERTa-v2 masks padded queries over every key with HF's finfo.min: in fp32 the logits round away and
    the row is the mean of V. In fp16 no fill swamps them in a kernel accumulating in fp32 (TensorRT's, the
    plugins'), so such rows get a zero query: the fp16 TRT-op model matches the original there too (was 0.34)."""
    model = onnx.load(str(zoo_export("deberta-v2", "torchscript")))
    result = fuse_trt(model, name="deberta-v2", form="padded", precision="fp16")
    assert result.ok and result.verification.max_abs_err <= 0.01, result.verification
    producers = {o: n for n in result.model.graph.node for o in n.output}
    for node in trt_nodes(result.model, "TRT_Attention"):
        q = producers[node.input[0]]
        while q.op_type != "Where":
            q = producers[q.input[0]]
        assert producers[q.input[0]].op_type == "LessOrEqual"  # the rows masked everywhere


# `fuse --ops trt` at int8 and fp8 end to end, on the zoo BERT calibrated as
# tests/routes/test_build_quantized.py does it (ModelOpt PTQ on CPU: slow).
def _trt_ops(model):
    return collections.Counter(n.op_type for n in model.graph.node if n.domain == "trt")


DIMS = {"seq": 32}  # ModelOpt leaves GEMMs under 16 unquantized


@pytest.fixture(scope="module")
def bert_calib(zoo_export, tmp_path_factory):
    pytest.importorskip("modelopt.onnx.quantization", reason="ModelOpt's ONNX quantization (the quant extra)")
    from trtattn.graph.feeds import make_feeds
    from trtattn.rewrite.quantize import stack_feeds

    bert = zoo_export("bert", "torchscript")
    model = onnx.load(str(bert))
    path = tmp_path_factory.mktemp("calib") / "bert-calib.npz"
    np.savez(path, **stack_feeds([make_feeds(model, dims=DIMS, seed=s, padding=False) for s in range(8)]))
    return bert, path


@pytest.mark.slow
@pytest.mark.parametrize("mode,onnx_type", [("int8", onnx.TensorProto.INT8), ("fp8", onnx.TensorProto.FLOAT8E4M3FN)])
def test_fuse_ops_trt_quantized_end_to_end(bert_calib, tmp_path, capsys, mode, onnx_type):
    """`trtattn fuse bert --ops trt --precision int8|fp8 --calib X.npz`: ModelOpt calibrates, both sites become
    TRT_QuantizedAttention quantizing their softmax to `mode`, the CPU check (trtattn_plugins) passes, the
    model and its trtexec sidecar are written, exit 0 (measured: 0.11 of 0.56 at int8, 0.32 of 1.1 at fp8)."""
    from trtattn.cli import main

    bert, calib = bert_calib
    out, report = tmp_path / f"bert-{mode}.onnx", tmp_path / "report.json"
    code = main(["-q", "fuse", str(bert), "-o", str(out), "--ops", "trt", "--precision", mode, "--calib", str(calib),
                 "--dims", "seq=32", "--report", str(report)])
    printed = capsys.readouterr().out
    assert code == 0 and out.exists() and out.with_suffix(".json").exists(), printed
    written = onnx.load(str(out))
    sites = [n for n in written.graph.node if n.domain == "trt"]
    assert [n.op_type for n in sites] == ["TRT_QuantizedAttention"] * 2, _trt_ops(written)
    for node in sites:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["normalization_quantize_to_type"] == onnx_type
    verification = json.loads(report.read_text())["verification"]
    assert verification["passed"] and verification["max_abs_err"] < verification["atol"], verification
