"""The CLI as a user meets it: bad inputs, never touching the input, reports, exit codes."""

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.conftest import sha256
from trtattn.cli import main
from trtattn.graph import io as onnxio
from trtattn.testing.graphs import attention_model


def run(*args):
    """The installed console script (next to this interpreter), as a user runs it."""
    script = Path(sys.executable).parent / "trtattn"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "trtattn"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True)


def _bad_files(tmp_path):
    good = tmp_path / "good.onnx"
    onnx.save(attention_model(), str(good))
    files = {}
    files["missing"] = tmp_path / "nope.onnx"
    files["empty"] = tmp_path / "empty.onnx"
    files["empty"].write_bytes(b"")
    files["not_onnx"] = tmp_path / "text.onnx"
    files["not_onnx"].write_text("this is not a model\n" * 20)
    files["truncated"] = tmp_path / "truncated.onnx"
    files["truncated"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    files["directory"] = tmp_path / "adir.onnx"
    files["directory"].mkdir()
    # a model whose external data file is missing
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    onnx.save(attention_model(), str(ext_dir / "m.onnx"), save_as_external_data=True, location="m.data",
              size_threshold=0)
    (ext_dir / "m.data").unlink()
    files["missing_external_data"] = ext_dir / "m.onnx"
    return files


@pytest.mark.parametrize("kind,message", [("missing", "no such file"), ("empty", "empty"),
                                          ("not_onnx", "not a valid ONNX model"),
                                          ("truncated", "not a valid ONNX model"),
                                          ("directory", "directory"),
                                          ("missing_external_data", "external data file 'm.data'")])
def test_bad_input_is_one_line_no_traceback(tmp_path, kind, message):
    path = _bad_files(tmp_path)[kind]
    before = sha256(path) if path.is_file() else None
    out = tmp_path / "out.onnx"
    proc = run("fuse", path, "-o", out)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(path.name) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out.exists()
    if before:
        assert sha256(path) == before


def test_external_data_escaping_the_folder_is_refused(tmp_path):
    model = attention_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    m = onnx.load(str(path), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../../etc/passwd"
    onnx.save(m, str(path))
    with pytest.raises(Exception, match="outside the model's folder"):
        onnxio.load(path)


def test_fuse_writes_output_and_report_and_keeps_the_input(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(attention_model(mask_style="causal_range"), str(src))
    before = sha256(src)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    proc = run("fuse", src, "-o", out, "--report", report)
    assert proc.returncode == 0, proc.stderr
    assert sha256(src) == before
    data = json.loads(report.read_text())
    (site,) = data["sites"]
    for key in ["name", "q_heads", "kv_heads", "head_size", "scale", "mask", "causal", "cache", "rope",
                "status", "reason", "max_abs_err"]:
        assert key in site
    assert site["status"] == "fused" and site["causal"] == "upper_left" and site["max_abs_err"] <= 1e-4
    assert data["counts"] == {"sites": 1, "softmaxes": 1, "attention_ops": 0, "fused": 1, "not_fused": 0,
                              "not_attention": 0}
    assert any(n.op_type == "Attention" for n in onnx.load(str(out)).graph.node)
    assert "upper_left" in proc.stdout and "fused" in proc.stdout  # the per-site table


def test_output_over_input_is_refused(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(attention_model(), str(src))
    before = sha256(src)
    proc = run("fuse", src, "-o", src)
    assert proc.returncode == 2 and "refusing to write over the input" in proc.stderr
    assert sha256(src) == before


def test_model_without_attention_exits_0_with_zero_sites(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", 4])
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g", [x], [y]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    src, out, report = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    assert main(["-q", "fuse", str(src), "-o", str(out), "--report", str(report)]) == 0
    assert out.read_bytes() == src.read_bytes()
    data = json.loads(report.read_text())
    assert data["sites"] == [] and data["counts"]["sites"] == 0
    assert data["ignored"] and "graph output" in data["ignored"][0]["reason"]


def test_unfusable_site_exits_nonzero_and_writes_nothing(tmp_path):
    import numpy as np

    model = attention_model(mask_style="bool_where")
    for init in model.graph.initializer:  # Where(mask, scores, 0): zeroes, not masks
        if init.dims == [] and np.isinf(onnx.numpy_helper.to_array(init)).all():
            init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(0.0, np.float32), init.name))
    src, out, report = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    assert main(["-q", "fuse", str(src), "-o", str(out), "--report", str(report)]) == 1
    assert not out.exists()
    (site,) = json.loads(report.read_text())["sites"]
    assert site["status"] == "not fused" and "large negative" in site["reason"]


def test_python_module_entry_point(capsys):
    proc = subprocess.run([sys.executable, "-m", "trtattn", "zoo", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "list zoo models" in proc.stdout
    # the listing's table here: in a new process it imports torch and transformers for the configs (~20 s)
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert "llama-cache" in out and "cannot export" in out


@pytest.mark.slow  # exports BART in a subprocess: ~55 s
def test_demo_runs_the_default_model(tmp_path):
    proc = run("demo", "--out-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "6 attention-like softmaxes: 6 fused, 0 not fused" in proc.stdout
    assert (tmp_path / "bart.torchscript.fused.onnx").exists()
