"""Verification on inputs the model accepts (issue 18, class 5): feeds searched in the model's domain until
the original's outputs are finite (a noise level under a log, lengths that must lie within the sequence),
random ops seeded alike on both models or refused with one line, and the user's own inputs (--inputs: an
.npz or Polygraphy's inputs JSON) used exactly, with one line for any that does not fit."""

import json
from collections import OrderedDict

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtattn.errors import TrtattnError, VerificationError
from trtattn.graph.user_inputs import GivenInputs, InputsUsed, load_inputs
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


def _tail(model: onnx.ModelProto, kind: str) -> onnx.ModelProto:
    """attention_model's output y with something after it that needs inputs in a domain: `log`: + Log(noise)
    (noise [1] must be positive), `lengths`: / lengths (int64 [batch], zero gives inf), `random`: +
    RandomNormalLike(y) * noise (noise [1]), `random_unnamed_in_if`: a RandomUniformLike inside an If body."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    y = g.output[0].name
    out = "y_final"
    if kind == "log":
        g.input.append(helper.make_tensor_value_info("noise", TensorProto.FLOAT, [1]))
        g.node.extend([helper.make_node("Log", ["noise"], ["log_noise"], name="log"),
                       helper.make_node("Add", [y, "log_noise"], [out], name="add_log")])
    elif kind == "lengths":
        g.input.append(helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"]))
        g.initializer.append(numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "len_shape"))
        g.node.extend([helper.make_node("Cast", ["lengths"], ["len_f"], to=TensorProto.FLOAT),
                       helper.make_node("Reshape", ["len_f", "len_shape"], ["len_3d"]),
                       helper.make_node("Div", [y, "len_3d"], [out], name="mean_over_length")])
    elif kind == "random":
        g.input.append(helper.make_tensor_value_info("noise", TensorProto.FLOAT, [1]))
        g.node.extend([helper.make_node("RandomNormalLike", [y], ["eps"], name="draw_noise"),
                       helper.make_node("Mul", ["eps", "noise"], ["scaled"]),
                       helper.make_node("Add", [y, "scaled"], [out])])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
    return m


def test_noise_under_a_log_gets_positive_values():
    model = _tail(attention_model(), "log")
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    inputs = result.verification.inputs
    assert inputs.source == "searched"
    assert inputs.domains["noise"] == "positive" and inputs.domains["x"] == "normal"
    assert result.verification.max_abs_err <= 1e-4


def test_lengths_within_the_sequence():
    model = _tail(attention_model(), "lengths")
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert result.verification.inputs.domains["lengths"] == "lengths within the sequence"
    from trtattn.graph.domains import feeds_in

    lengths = feeds_in(model, {"lengths": "lengths within the sequence"}, dims={"batch": 256, "seq": 6}, seed=0)["lengths"]
    assert lengths.dtype == np.int64 and lengths.min() == 1 and lengths.max() == 6  # 1..seq, both ends reached


def test_random_ops_found_in_control_flow_bodies():
    from trtattn.graph.domains import random_nodes
    from trtattn.verify import compare_models

    out = helper.make_tensor_value_info("r", TensorProto.FLOAT, None)
    then = helper.make_graph([helper.make_node("RandomUniformLike", ["x"], ["r"], name="inner_draw")], "then", [], [out])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["r"])], "else", [], [out])
    graph = helper.make_graph([helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "g",
                              [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert [(n.name, n.op_type) for n in random_nodes(model)] == [("inner_draw", "RandomUniformLike")]
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    next(a for a in renamed.graph.node[0].attribute if a.name == "then_branch").g.node[0].name = "other"
    with pytest.raises(VerificationError, match="node 'inner_draw' \\(RandomUniformLike\\)"):
        compare_models(model, renamed)


def test_random_op_seeded_alike_on_both_models():
    """normalize keeps the opset (fuse's opset-23 output has no RandomNormalLike kernel in ONNX Runtime)."""
    from trtattn.rewrite.normalize import normalize_model
    from trtattn.verify import compare_models

    model = _tail(attention_model(), "random")
    result = normalize_model(model)
    assert result.ok and result.verification.max_abs_err <= 1e-4
    assert any("draw_noise (RandomNormalLike)" in n for n in result.verification.inputs.notes)
    assert not any(a.name == "seed" for n in result.model.graph.node if n.op_type == "RandomNormalLike"
                   for a in n.attribute)  # the seed is for the comparison only: the output keeps the model's op
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    next(n for n in renamed.graph.node if n.op_type == "RandomNormalLike").name = "other"
    with pytest.raises(VerificationError, match="node 'draw_noise' \\(RandomNormalLike\\).*--inputs"):
        compare_models(model, renamed)


def test_random_op_fused_model_is_listed_where_onnx_runtime_cannot_load_opset_23():
    """fuse writes opset 23, where ONNX Runtime has no RandomNormalLike kernel (RandomNormalLike-22): the attention
    verifies on the original's draws, but the written model would not load with ONNX Runtime's default options, so
    the site is listed with ONNX Runtime's reason and nothing less loadable than the input is written (issue 26)."""
    model = _tail(attention_model(), "random")
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["not fused"] and not result.ok
    assert "refuses the rewritten model" in result.reports[0].reason
    assert "RandomNormalLike(22)" in result.reports[0].reason and "draw_noise" in result.reports[0].reason
    assert [n.op_type for n in result.model.graph.node] == [n.op_type for n in model.graph.node]  # left as it was


def test_fed_draws_are_what_the_original_draws():
    """A candidate that computes something else after the draw is caught: the draws are fed, not skipped."""
    from trtattn.verify import compare_models

    model = _tail(attention_model(), "random")
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    next(n for n in wrong.graph.node if n.op_type == "Mul" and "eps" in n.input).op_type = "Add"
    assert compare_models(model, model).passed
    assert not compare_models(model, wrong).passed


def test_random_op_the_candidate_cannot_seed_is_refused_unless_its_outputs_repeat(tmp_path):
    import contextlib

    from trtattn.verify import compare_runners, onnx_runner
    from trtattn.verify.adapters import Adapter

    model = _tail(attention_model(), "random")
    with contextlib.ExitStack() as stack:  # a candidate that is not an ONNX model with the node (an engine)
        runners = [onnx_runner(stack, model, name="original"), onnx_runner(stack, model, name="candidate")]
        outcome = compare_runners(*runners, Adapter(model, [i.name for i in model.graph.input]))
    assert outcome.passed  # noise at zero: the original repeats itself
    assert outcome.inputs.domains["noise"] == "zero"
    model.graph.node[-2].input[1] = "eps"  # the noise no longer scaled by an input: nothing makes it repeat
    with contextlib.ExitStack() as stack, pytest.raises(VerificationError, match="node 'draw_noise' .*--inputs"):
        runners = [onnx_runner(stack, model, name="original"), onnx_runner(stack, model, name="candidate")]
        compare_runners(*runners, Adapter(model, [i.name for i in model.graph.input]))


def _feeds(seed=0, batch=2, seq=6):
    rng = np.random.default_rng(seed)
    return OrderedDict(x=rng.standard_normal((batch, seq, 32)).astype(np.float32),
                       noise=np.array([0.5 + seed], np.float32))


def test_given_inputs_are_used_exactly(tmp_path):
    from polygraphy.json import save_json

    model = _tail(attention_model(), "log")
    path = tmp_path / "inputs.json"
    save_json([_feeds(0), _feeds(1, seq=5), _feeds(2)], path)  # Polygraphy's own writer (--save-inputs)
    given = GivenInputs.load(path, model)
    assert len(given.sets) == 3 and given.sets[1]["x"].shape == (2, 5, 32)
    result = fuse_model(model, inputs=given)
    assert result.ok
    assert result.verification.iterations == 3
    assert result.verification.inputs == InputsUsed("file", str(path), 3)


@pytest.mark.parametrize("change, message", [
    (lambda f: f.pop("noise"), "no value for the model's input 'noise'"),
    (lambda f: f.update(extra=np.zeros(1, np.float32)), "'extra' is not an input of the model"),
    (lambda f: f.update(x=f["x"][0]), "input 'x' has shape \\[6, 32\\], the model takes rank 3"),
    (lambda f: f.update(x=f["x"][..., :16]), "input 'x' has shape \\[2, 6, 16\\].*axis 2"),
    (lambda f: f.update(noise=f["noise"].astype(np.float64)), "input 'noise' is float64, the model takes float32"),
])
def test_given_inputs_that_do_not_fit_are_one_line(tmp_path, change, message):
    model = _tail(attention_model(), "log")
    feeds = _feeds()
    change(feeds)
    np.savez(tmp_path / "in.npz", **feeds)
    with pytest.raises(TrtattnError, match=message) as e:
        load_inputs(tmp_path / "in.npz", model)
    assert "\n" not in str(e.value) and "in.npz" in str(e.value)


def test_unreadable_inputs_file(tmp_path):
    model = _tail(attention_model(), "log")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TrtattnError, match="bad.json: not Polygraphy's inputs JSON"):
        load_inputs(tmp_path / "bad.json", model)
    with pytest.raises(TrtattnError, match="no such file"):
        load_inputs(tmp_path / "missing.npz", model)


@pytest.mark.parametrize("kind", ["npz", "polygraphy"])
def test_cli_inputs_on_fuse_and_verify(tmp_path, capsys, kind):
    from polygraphy.json import save_json

    from trtattn.cli import main

    src, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(_tail(attention_model(), "log"), src)
    if kind == "npz":
        path = tmp_path / "in.npz"
        np.savez(path, **_feeds(3))
        sets = 1
    else:
        path = tmp_path / "in.json"
        save_json([_feeds(0), _feeds(1)], path)  # what polygraphy run --save-inputs writes
        sets = 2
    report = tmp_path / "report.json"
    assert main(["-q", "fuse", str(src), "-o", str(out), "--inputs", str(path), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert f"over {sets} inputs; inputs from {path}" in printed
    verification = json.loads(report.read_text())["verification"]
    assert verification["inputs"] == {"source": "file", "iterations": sets, "path": str(path)}
    assert main(["-q", "verify", str(out), "--onnx", str(src), "--inputs", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["iterations"] == sets and data["inputs"]["path"] == str(path)
    # without --inputs: the searched domains are named
    assert main(["-q", "verify", str(out), "--onnx", str(src)]) == 0
    assert "inputs: searched inputs (x: normal, noise: positive)" in capsys.readouterr().out
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=_feeds()["x"])
    assert main(["-q", "fuse", str(src), "-o", str(tmp_path / "other.onnx"), "--inputs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"trtattn: error: --inputs {bad}: no value for the model's input 'noise'"
    assert not (tmp_path / "other.onnx").exists()


def test_inputs_on_normalize(tmp_path):
    from trtattn.cli import main

    model = _tail(attention_model(), "log")
    src, path = tmp_path / "m.onnx", tmp_path / "in.npz"
    onnx.save(model, src)
    np.savez(path, **_feeds(1))
    report = tmp_path / "r.json"
    assert main(["-q", "normalize", str(src), "-o", str(tmp_path / "n.onnx"), "--inputs", str(path),
                 "--report", str(report)]) == 0
    assert json.loads(report.read_text())["verification"]["inputs"]["path"] == str(path)


def test_inputs_on_build(tmp_path):
    from trtattn.routes.prepare import prepare

    model = _tail(attention_model(), "log")
    path = tmp_path / "in.npz"
    np.savez(path, **_feeds(1))
    prepared = prepare(model, name="m", precision="fp32", inputs=GivenInputs.load(path, model))
    assert prepared.verification.inputs == InputsUsed("file", str(path), 1)


def test_an_original_never_finite_is_compared_on_its_default_inputs_and_said_so():
    model = _tail(attention_model(), "log")
    model.graph.node[-2].input[0] = "zero"  # Log of a constant 0: -inf whatever the inputs
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "zero"))
    result = fuse_model(model)
    inputs = result.verification.inputs
    assert inputs.domains == {"x": "normal", "noise": "normal"}  # the default inputs, kept
    assert any("not finite on any inputs tried" in n for n in inputs.notes)


def _given(tmp_path, model, scale: float, sets: int = 3) -> GivenInputs:
    """Polygraphy's inputs JSON of `sets` input sets for attention_model (x [2, 6, 32]) scaled by `scale`."""
    from polygraphy.json import save_json

    rng = np.random.default_rng(7)
    path = tmp_path / f"x{scale:g}.json"
    save_json([OrderedDict(x=(rng.standard_normal((2, 6, 32)) * scale).astype(np.float32)) for _ in range(sets)], path)
    return GivenInputs.load(path, model)


def test_trt_ops_check_runs_on_the_given_inputs(tmp_path):
    """`fuse --ops trt`'s own check (its TensorRT ops on trtattn_plugins against the original) runs on the
    user's inputs: the report names the file and its 3 sets (generated inputs are 2 sets)."""
    pytest.importorskip("trtattn_plugins", reason="the TensorRT ops run on trtattn_plugins' kernels")
    from trtattn.routes.trt_ops import fuse_trt

    model = attention_model()
    result = fuse_trt(model, name="a", precision="fp32", inputs=_given(tmp_path, model, 1.0))
    assert result.ok, result.verification
    used = result.verification.inputs
    assert used is not None and used.source == "file" and result.verification.iterations == 3
    assert used.path is not None and used.path.endswith("x1.json")


def test_fp16_check_runs_on_the_given_inputs(tmp_path):
    """build's fp16 check (the form in fp16 against the fp32 form) runs on the user's inputs: inputs 1e3 times
    larger than any generated ones overflow fp16's logits, and the check refuses them; the same model on
    ordinary inputs passes, with the file named in its record."""
    pytest.importorskip("modelopt", reason="the fp16 conversion is ModelOpt's AutoCast")
    from trtattn.routes.prepare import prepare

    model = attention_model()
    prepared = prepare(model, name="a", precision="fp16", inputs=_given(tmp_path, model, 1.0))
    check = prepared.precision_check
    assert check is not None and check.inputs is not None and check.inputs.source == "file"
    assert check.inputs.path is not None and check.inputs.path.endswith("x1.json")
    with pytest.raises(TrtattnError):
        prepare(model, name="a", precision="fp16", inputs=_given(tmp_path, model, 1e3))
    assert prepare(model, name="a", precision="fp16").precision_check.inputs is None


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_quantized_checks_run_on_the_given_inputs(tmp_path, mode):
    """At int8/fp8 (ModelOpt PTQ, calibrated on --calib) the user's inputs reach every check: the Q/DQ model's
    accuracy against fp32, the fused model's verification and its tolerance, which is measured on them
    (inputs and calibration 10 times larger than generated ones give a tolerance over 5 times larger)."""
    pytest.importorskip("modelopt.onnx.quantization", reason="ModelOpt's ONNX quantization (the quant extra)")
    from trtattn.graph.feeds import make_feeds
    from trtattn.rewrite.quantize.source import fuse_tolerance
    from trtattn.routes.prepare import prepare

    model = attention_model()
    calib = {"x": (np.random.default_rng(1).standard_normal((4, 6, 32)) * 10).astype(np.float32)}
    given = _given(tmp_path, model, 10.0)
    prepared = prepare(model, name="a", precision=mode, calib=calib, inputs=given)
    assert prepared.source_model is not model and prepared.quantization.source == "ModelOpt PTQ"
    assert prepared.inputs is given
    assert prepared.fused.verification.inputs == InputsUsed("file", given.path, 3)
    assert prepared.quantization.inputs == InputsUsed("file", given.path, 3)
    assert prepared.quantization.to_json()["inputs"] == {"source": "file", "iterations": 3, "path": given.path}
    assert prepared.fused.verification.iterations == 3
    assert prepared.fused.verification.atol == pytest.approx(fuse_tolerance(prepared.source_model, mode, given.sets))
    generated = [make_feeds(model, seed=seed) for seed in (0, 1)]
    assert prepared.fused.verification.atol > 5 * fuse_tolerance(prepared.source_model, mode, generated)
