"""Tests for the survivors of mutating trtattn/cli/values.py (benchmarks/mutate.py, base d3efd07): each range's
boundary is accepted and the value just past it refused, a value that is not a number says so, and a bad
value exits 2 (argparse's usage error) on one line. And of issue 27's sample: `build DIR` with TensorRT builds
every part that was prepared, past one that was not (cli/build.py)."""

import argparse
import json

import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.cli import main, values
from trtattn.testing.graphs import attention_model


@pytest.mark.parametrize("kind,edge,value,inside,past", [
    (values.tolerance, "0", 0.0, ("0.5", 0.5), "-1e-9"),
    (values.non_negative, "0", 0, ("3", 3), "-1"),
    (values.positive, "1", 1, ("2", 2), "0"),
    (values.memory_size, "1M", 1 << 20, ("1.5G", 3 << 29), "1023K"),
])
def test_each_range_takes_its_edge_and_refuses_past_it(kind, edge, value, inside, past):
    assert kind(edge) == value and kind(inside[0]) == inside[1]
    with pytest.raises(argparse.ArgumentTypeError, match=repr(past)):
        kind(past)


@pytest.mark.parametrize("kind,word", [(values.tolerance, "number"), (values.non_negative, "integer"),
                                       (values.positive, "integer"), (values.memory_size, "memory size")])
def test_a_value_that_is_not_a_number_says_what_was_expected(kind, word):
    with pytest.raises(argparse.ArgumentTypeError, match=f"'x1' is not an? {word}"):
        kind("x1")


def test_a_bad_value_exits_2_with_one_line(capsys):
    parser = values.OneLineParser(prog="trtattn fuse")
    parser.add_argument("--atol", type=values.tolerance)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--atol", "-1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trtattn fuse: error: argument --atol: '-1'"), err


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
