"""Without --precision a route takes the model's own precision (rewrite/precision chosen_precision): a bf16 model
bf16, an fp16 one fp16, an fp32 one the route's default (fp16), and says which and why. Before, a bf16 model without
--precision was refused ("builds it only with --precision bf16"). A user's bf16 --inputs (.npz and Polygraphy's
JSON store bf16 as raw bytes, read back as "|V2") are taken as bf16 and widened to fp32 exactly with the model the
route verifies; before, they were refused ("input 'q' is |V2") or did not run on the widened model."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from precision_models import bf16_attention, fp16_attention, needs_autocast

from trtattn.cli import main
from trtattn.graph.precision import ModelPrecision, Weighing, model_precision
from trtattn.graph.user_inputs import GivenInputs
from trtattn.rewrite.precision.common import PrecisionError, chosen_precision
from trtattn.routes.prepare import prepare
from trtattn.testing.graphs import attention_model


def test_the_models_own_precision_is_read_from_its_weights_else_its_io():
    assert model_precision(fp16_attention(), Weighing.COMPUTED) == ModelPrecision("fp16", "weights")
    # no weights: its IO says
    assert model_precision(bf16_attention(), Weighing.COMPUTED) == ModelPrecision("bf16", "inputs and outputs")
    assert model_precision(attention_model(), Weighing.COMPUTED).name == "fp32"
    assert chosen_precision(bf16_attention(), None) == ("bf16", "precision bf16, from the model's inputs and "
                                                                "outputs (no --precision given)")
    assert chosen_precision(attention_model(), None)[0] == "fp16"  # fp32: the route's default
    assert chosen_precision(bf16_attention(), "fp32") == ("fp32", None)  # an explicit --precision always wins


def _bf16_sets(seed=5):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((2, 2, 5, 16)).astype(ml_dtypes.bfloat16) for n in "qkv"}


@needs_autocast
def test_bf16_model_without_precision_builds_in_bf16_saying_why():
    prepared = prepare(bf16_attention(), name="bf16_attention")
    plan = prepared.plan
    assert plan.precision == "bf16" and {a.dtype for a in plan.attentions} == {"bf16"}
    assert plan.notes[0] == "precision bf16, from the model's inputs and outputs (no --precision given)"
    with pytest.raises(PrecisionError, match="computes in bf16.*--precision bf16"):  # an explicit other one: refused
        prepare(bf16_attention(), name="bf16_attention", precision="fp16")


@needs_autocast
def test_fuse_trt_ops_on_a_bf16_model_without_precision_verifies_on_the_users_bf16_inputs(tmp_path):
    """`fuse --ops trt --inputs X.npz` on a bf16 model: the .npz's bf16 arrays read as bf16, widened exactly for the
    fp32 model the route verifies, and every check (fused, form, the written TensorRT ops) runs on them."""
    from trtattn.routes.trt_ops import fuse_trt

    sets = _bf16_sets()
    np.savez(tmp_path / "x.npz", **sets)
    model = bf16_attention()
    given = GivenInputs.load(tmp_path / "x.npz", model)
    assert {v.dtype for v in given.sets[0].values()} == {np.dtype(ml_dtypes.bfloat16)}
    result = fuse_trt(model, name="bf16_attention", inputs=given)
    prepared = result.prepared
    assert result.ok and prepared.plan.precision == "bf16"
    for name, value in sets.items():  # the values given, exactly, as the widened model takes them
        np.testing.assert_array_equal(prepared.inputs.sets[0][name], value.astype(np.float32))
    assert prepared.verification.inputs.source == "file"
    assert prepared.precision_check.inputs.source == "file"


def test_bf16_inputs_from_polygraphy_json_are_read_as_bf16(tmp_path):
    from polygraphy.json import save_json

    sets = [_bf16_sets(1), _bf16_sets(2)]
    save_json(sets, str(tmp_path / "x.json"))
    given = GivenInputs.load(tmp_path / "x.json", bf16_attention())
    for got, want in zip(given.sets, sets):
        assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in want.items()}
        assert all(np.array_equal(got[k].view(np.uint16), want[k].view(np.uint16)) for k in want)


@needs_autocast
def test_fp16_model_without_precision_builds_in_fp16_on_its_fp16_inputs(tmp_path, capsys):
    """`build` on an fp16 model (no TensorRT: the plan, exit 4) says the precision came from the model's weights
    and verifies on the user's fp16 inputs."""
    model, path = fp16_attention(), tmp_path / "fp16_attention.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(3).standard_normal((2, 6, 32)).astype(np.float16)
    np.savez(tmp_path / "x.npz", x=x)
    plan_json = tmp_path / "plan.json"
    code = main(["-q", "build", str(path), "--out-dir", str(tmp_path / "engines"), "--inputs", str(tmp_path / "x.npz"),
                 "--plan-json", str(plan_json)])
    out = capsys.readouterr().out
    assert code in (0, 4), out
    assert "note: precision fp16, from the model's weights (no --precision given)" in out
    assert "(padded, fp16)" in out
    prepared = prepare(model, name="fp16_attention", inputs=GivenInputs.load(tmp_path / "x.npz", model))
    assert prepared.plan.precision == "fp16" and prepared.verification.inputs.source == "file"
    np.testing.assert_array_equal(prepared.inputs.sets[0]["x"], x)  # an fp16 model runs on ONNX Runtime: kept


@needs_autocast
def test_fp32_model_without_precision_keeps_the_routes_default(capsys):
    prepared = prepare(attention_model(), name="fp32_attention")
    assert prepared.plan.precision == "fp16"
    assert "precision fp16, the default for a model in fp32 (no --precision given)" in prepared.plan.notes


def test_normalize_without_precision_judges_fusability_in_the_models_precision(tmp_path, capsys):
    import json

    path, report = tmp_path / "fp16_attention.onnx", tmp_path / "report.json"
    onnx.save(fp16_attention(), str(path))
    assert main(["-q", "normalize", str(path), "-o", str(tmp_path / "out.onnx"), "--report", str(report)]) == 0
    assert "note: precision fp16, from the model's weights (no --precision given)" in capsys.readouterr().out
    assert json.loads(report.read_text())["precision"] == "fp16"
