"""`trtattn build --plan-json` (issue 12, item 6) and what a user ships from `build` without TensorRT: the plan
in exactly the issue's keys, a kv-cache plan with static cache capacities and profiles from the model, and an
fp16 form (`--save-onnx`) with its matmul work in fp16, verified, IO types kept."""

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from trtattn.graph.feeds import make_feeds
from trtattn.rewrite.precision import precision_table
from trtattn.trt.plan import AttentionPlan, BuildPlan, TensorIO
from trtattn.trt.profiles import PlanLimits

SITE_KEYS = {"name", "dtype", "causal_kind", "mask", "kv_lengths", "normalization_quantize_to_type", "reason"}


def _build(*args):
    script = Path(sys.executable).parent / "trtattn"
    return subprocess.run([str(script), "build", *map(str, args)], capture_output=True, text=True)


def _check_keys(plan):
    assert set(plan) == {"form", "precision", "inputs", "profiles", "sites", "precision_table"}
    assert all(set(i) == {"name", "shape", "dtype"} for i in plan["inputs"])
    assert all(set(row) == {"min", "opt", "max"} for p in plan["profiles"] for row in p.values())
    assert all(set(s) == SITE_KEYS for s in plan["sites"])


def test_kv_cache_plan_json_has_static_caches_and_profiles_from_the_model(zoo_export, tmp_path):
    """Whisper's decoder step: its position table has 64 rows, so the caches hold 64 and every sequence-like
    profile dim runs to 64 (8 rows of them when packed), whatever the verification dims."""
    src = zoo_export("whisper-decoder-cache", "torchscript")
    out = tmp_path / "plan.json"
    proc = _build(src, "--form", "kv-cache", "--precision", "fp32", "--plan-json", out, "--out-dir", tmp_path,
                  "--dims", "batch=3,seq=5,past=4")
    assert proc.returncode in (0, 4), proc.stderr
    plan = json.loads(out.read_text())
    _check_keys(plan)
    assert plan["form"] == "kv-cache" and plan["precision"] == "fp32" and plan["precision_table"] == {"fp32": 1.0}
    inputs = {i["name"]: i for i in plan["inputs"]}
    caches = [n for n in inputs if n.endswith(".decoder.key") or n.endswith(".decoder.value")]
    assert len(caches) == 4 and all(inputs[c]["shape"] == ["batch", 4, 64, 16] for c in caches)
    assert inputs["input_ids"]["shape"] == [1, "total_tokens"] and inputs["cu_seqlens"]["shape"] == ["batch+1"]
    (profile,) = plan["profiles"]
    assert profile["input_ids"] == {"min": [1, 1], "opt": [1, 256], "max": [1, 512]}
    assert profile[caches[0]]["max"] == [8, 4, 64, 16]
    sites = {s["name"]: s for s in plan["sites"]}
    self_attn = [s for s in sites.values() if s["kv_lengths"]]
    assert len(sites) == 4 and len(self_attn) == 2
    assert all(s["causal_kind"] == "lower_right" and s["mask"] is None and s["dtype"] == "fp32" for s in self_attn)
    assert all(s["reason"] is None and s["normalization_quantize_to_type"] is None for s in sites.values())


def test_fp16_build_saves_a_verified_fp16_form_and_its_plan(zoo_export, tmp_path):
    """`build --precision fp16 --save-onnx DIR`: the form TensorRT gets runs >= 95% of its matmul work in fp16,
    keeps the model's IO types, and the plan says the same."""
    src = zoo_export("llama", "torchscript")
    proc = _build(src, "--save-onnx", tmp_path, "--plan-json", tmp_path / "plan.json", "--out-dir", tmp_path,
                  "--max-positions", 64)
    assert proc.returncode in (0, 4), proc.stderr
    assert "matmul work by dtype: fp16 100.0%" in proc.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    _check_keys(plan)
    assert plan["precision"] == "fp16" and plan["precision_table"]["fp16"] >= 0.95
    assert all(s["dtype"] == "fp16" and s["causal_kind"] == "upper_left" and s["mask"] is None
               and s["kv_lengths"] == "attention_mask/lengths" for s in plan["sites"])
    assert plan["profiles"][0]["input_ids"]["max"] == [8, 64]
    form = onnx.load(str(tmp_path / "llama.torchscript.padded.onnx"))
    original = onnx.load(str(src))
    assert [(i.name, i.type.tensor_type.elem_type) for i in form.graph.input] == \
        [(i.name, i.type.tensor_type.elem_type) for i in original.graph.input]
    assert form.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # IO kept
    assert precision_table(form, make_feeds(original)).get("fp16", 0) >= 0.95


@pytest.mark.parametrize("args,message", [(["--precision", "fp16", "--io-dtype", "bf16"], "--io-dtype bf16"),
                                          (["--max-shapes", "nope:2x3"], "nope")])
def test_bad_build_settings_are_one_line(zoo_export, tmp_path, args, message):
    proc = _build(zoo_export("bert", "torchscript"), "--out-dir", tmp_path, *args)
    err = [line for line in proc.stderr.splitlines() if not line.startswith("[trtattn]")]
    assert proc.returncode == 2 and len(err) == 1 and message in err[0], proc.stderr


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def test_plan_row_carries_the_normalization_quantize_type():
    """plan.py:75 (row()): `build --plan-json` says which sites IAttention quantizes after the softmax."""
    site = AttentionPlan("site", "attn", "layer", "q", "k", "v", "y", 0.25, dtype="int8",
                         normalization_quantize_to_type="int8", normalization_quantize_scale=1 / 127)
    assert site.row()["normalization_quantize_to_type"] == "int8"
    assert AttentionPlan("site", "attn", "layer", "q", "k", "v", "y", 0.25).row()["normalization_quantize_to_type"] \
        is None


def test_engine_outputs_dims_are_named_after_the_inputs_dims_they_provably_are():
    """An output dim the exporter named after an op (TorchScript: 'MatMul..._dim_1', `trtattn demo` showed it)
    is the inputs' 'seq' in the engine's I/O: ONNX Runtime's symbolic shapes of the original prove it."""
    from trtattn.graph.shapes import dims_of
    from trtattn.routes.prepare import prepare
    from trtattn.testing.graphs import attention_model

    model = attention_model()
    (out,) = model.graph.output
    out.type.CopyFrom(onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch", f"MatMul{out.name}_dim_1", 32]))
    prepared = prepare(model, name="m", precision="fp32")
    assert [i.shape for i in prepared.plan.inputs] == [["batch", "seq", 32]]
    assert [(o.name, o.shape) for o in prepared.plan.outputs] == [(out.name, ["batch", "seq", 32])]
    assert dims_of(model.graph.output[0]) == ["batch", f"MatMul{out.name}_dim_1", 32]  # the model as read


def test_the_io_contract_and_limits_are_json_only_where_written():
    """TensorIO and PlanLimits are records; the sidecar's "io" and a rank plan's JSON keep the keys, in order."""
    plan = BuildPlan("m", "padded", "fp16", inputs=[TensorIO("input_ids", "int64", ["batch", "seq"])],
                     outputs=[TensorIO("logits", "float16", ["batch", "seq", 8])], limits=PlanLimits(8, 64))
    assert json.dumps(plan.io_json()) == (
        '{"inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"]}], '
        '"outputs": [{"name": "logits", "dtype": "float16", "shape": ["batch", "seq", 8]}], '
        '"aliases": {}, "right_padded": []}')
    data = plan.to_json()
    assert data["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"]}]
    assert data["limits"] == {"max_positions": 64, "max_batch": 8}
    assert plan.plan_json()["inputs"] == [{"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"}]
    assert BuildPlan("m", "padded", "fp16").to_json()["limits"] == {}
