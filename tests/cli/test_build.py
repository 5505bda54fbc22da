"""trtattn/cli/build.py: `trtattn build`, one model or an export folder.

cli/build: options that do not apply are refused before any work, in one line."""

import json

import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.cli import main
from trtattn.testing.graphs import attention_model


# A survivor of issue 27's mutation sample (benchmarks/mutate.py): `build DIR` goes on past a part it cannot prepare.
@pytest.mark.conformance
def test_build_folder_builds_every_prepared_part_after_one_that_cannot_be(checked_trt, tmp_path, monkeypatch, capsys):
    """An encoder with no attention cannot be prepared; the two decoders after it are still built (on trtsim's
    checked TensorRT, which records the builder's calls and builds nothing: the engine file is a stand-in)."""
    from trtattn.routes import builder
    from trtattn.trt import compat

    folder = tmp_path / "export"
    folder.mkdir()
    relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "encoder",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])])
    onnx.save(helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "encoder_model.onnx"))
    onnx.save(attention_model(), str(folder / "decoder_model.onnx"))
    onnx.save(attention_model(seed=1), str(folder / "decoder_with_past_model.onnx"))
    built, real_build = [], builder.build

    def build(prepared, trt, out_dir, **settings):
        real_build(prepared, trt, out_dir, progress=False, write=False)  # the real calls, checked
        built.append(prepared.plan.name)
        engine = out_dir / f"{prepared.plan.name}.engine"
        engine.write_bytes(b"stand-in")
        return engine, out_dir / f"{prepared.plan.name}.json"

    monkeypatch.setattr(compat, "import_tensorrt", lambda: checked_trt)
    monkeypatch.setattr(builder, "build", build)
    assert main(["build", str(folder), "--out-dir", str(tmp_path / "out"), "--precision", "fp32"]) == 1
    assert built == ["decoder", "decoder_with_past"] and not checked_trt.sim.problems
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] in (["encoder"], ["decoder"], ["decoder_with_past"])}
    assert [rows[r][2] for r in ("encoder", "decoder", "decoder_with_past")] == ["-", "-", "-"]  # no branch: "-"
    assert rows["encoder"][4:6] == ["not", "prepared"] and rows["decoder"][4] == "prepared"
    sidecar = json.loads((tmp_path / "out" / "export" / "pipeline.json").read_text())
    assert sidecar["built"] and "no attention" in sidecar["parts"]["encoder"]["error"]
    assert {role: part["file"] for role, part in sidecar["parts"].items() if "error" not in part} == {
        "decoder": "decoder.engine", "decoder_with_past": "decoder_with_past.engine"}


def test_save_onnx_with_tp_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(attention_model(), model)
    forms, engines = tmp_path / "forms", tmp_path / "engines"
    code = main(["build", str(model), "--tp", "2", "--save-onnx", str(forms), "--out-dir", str(engines)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"--save-onnx {forms} does not apply with --tp" in err and str(engines) in err
    assert not forms.exists() and not engines.exists()
