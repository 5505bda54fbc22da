"""Bad input and faults (issue 19): a malformed-model corpus, bad paths and values, a full disk, kills during
a write, stale scratch folders, memory bounds of the dims search, and the slicing decision.

Every case of the corpus: a non-zero exit, one line naming the problem, every input byte-identical, and
nothing left behind (in the model's folder nor in the temp folder)."""

import contextlib
import io
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import ROOT, sha256
from trtattn.cli import main
from trtattn.errors import TrtattnError
from trtattn.graph import io as onnxio
from trtattn.graph import memory, slices, validate
from trtattn.graph.dims import fit_dims
from trtattn.testing.graphs import attention_model


def cli(*args):
    """The command line in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["-q", *map(str, args)])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (sha256(p) if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def our_temps(pid: int | None = None) -> set:
    """Scratch folders of this process (or `pid`) in the temp folder (other runs may share it)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"trtattn-{pid or os.getpid()}-*")}


def save_external(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)
    return path


def relu_model(width: int = 64) -> onnx.ModelProto:
    """No attention: fuse writes it whole."""
    w = onnx.numpy_helper.from_array(np.ones((width, width), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------- the corpus
def _raw(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())  # as it is, without onnx.save's checks
    return path


def _unknown_op(tmp):
    m = attention_model()
    next(n for n in m.graph.node if n.op_type == "Softmax").op_type = "SoftMaxx"
    return _raw(m, tmp / "m.onnx"), "SoftMaxx"


def _ghost_output(tmp):
    m = attention_model()
    m.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, None))
    return _raw(m, tmp / "m.onnx"), "'ghost' is produced by no node"


def _untyped_input(tmp):
    m = attention_model()
    m.graph.input[0].ClearField("type")
    return _raw(m, tmp / "m.onnx"), f"input '{m.graph.input[0].name}' has no type"


def _undefined_input(tmp):
    m = attention_model()
    m.graph.node[1].input[0] = "nowhere"
    return _raw(m, tmp / "m.onnx"), "'nowhere'"


def _bytes(tmp, data: bytes, name="m.onnx"):
    (tmp / name).write_bytes(data)
    return tmp / name


def _truncated(tmp):
    data = attention_model().SerializeToString()
    return _bytes(tmp, data[: len(data) // 3]), "not a valid ONNX model"


def _corrupted(tmp):
    data = bytearray(attention_model().SerializeToString())
    data[10:400] = bytes(range(256)) + bytes(range(134))
    return _bytes(tmp, bytes(data)), "m.onnx"


def _external(tmp, edit, expected):
    path = save_external(attention_model(), tmp / "m.onnx")
    m = onnx.load(str(path), load_external_data=False)
    t = next(t for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    entries = {e.key: e.value for e in t.external_data}
    entries.update(edit(tmp, entries))
    del t.external_data[:]
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    return _raw(m, path), expected


def _symlink_out(tmp, entries):
    outside = tmp.parent / f"{tmp.name}-secret.data"
    outside.write_bytes(b"\0" * (1 << 16))
    (tmp / "link.data").symlink_to(outside)
    return {"location": "link.data"}


CORPUS = {
    "empty": lambda tmp: (_bytes(tmp, b""), "empty"),
    "not_onnx": lambda tmp: (_bytes(tmp, b"\x89PNG not a model at all\n" * 40), "not a valid ONNX model"),
    "truncated": _truncated,
    "corrupted": _corrupted,
    "unknown_op": _unknown_op,
    "ghost_output": _ghost_output,
    "untyped_input": _untyped_input,
    "undefined_input": _undefined_input,
    "ext_traversal": lambda tmp: _external(tmp, lambda t, e: {"location": "../../etc/passwd"}, "outside the model's folder"),
    "ext_absolute": lambda tmp: _external(tmp, lambda t, e: {"location": "/etc/passwd"}, "outside the model's folder"),
    "ext_symlink_out": lambda tmp: _external(tmp, _symlink_out, "outside the model's folder"),
    "ext_past_end": lambda tmp: _external(tmp, lambda t, e: {"offset": "0", "length": str(1 << 30)}, "truncated"),
    "ext_missing": lambda tmp: _external(tmp, lambda t, e: {"location": "gone.data"}, "'gone.data'"),
}


def _refused(argv, inputs, folder, expected):
    before, temps = tree(folder), our_temps()
    code, out, err = cli(*argv)
    lines = err.strip().splitlines()
    assert code not in (0, None), (code, out, err)
    assert len(lines) == 1 and expected in lines[0], err
    assert "internal error" not in err and "Traceback" not in err
    assert tree(folder) == before, "an input changed or something was left behind"
    assert our_temps() <= temps, "a scratch folder was left in the temp folder"
    return lines[0]


@pytest.mark.parametrize("case", sorted(CORPUS))
@pytest.mark.parametrize("command", ["fuse", "normalize"])
def test_malformed_model_is_refused_in_one_line(tmp_path, case, command):
    folder = tmp_path / "in"
    folder.mkdir()
    model, expected = CORPUS[case](folder)
    _refused([command, model, "-o", tmp_path / "in" / "out.onnx"], [model], folder, expected)


@pytest.mark.parametrize("case", ["unknown_op", "ghost_output", "untyped_input"])
def test_invalid_model_refused_by_build_verify_run(tmp_path, case):
    model, expected = CORPUS[case](tmp_path)
    for argv in (["build", model, "--out-dir", tmp_path / "engines"], ["run", model],
                 ["verify", model, "--onnx", model]):
        _refused(argv, [model], tmp_path, expected)


def test_valid_models_pass_the_check(tmp_path):
    """Custom domains ONNX does not define, local functions and external data are valid."""
    m = relu_model()
    m.graph.node.append(helper.make_node("FusedMatMul", ["y", "w"], ["z"], domain="com.microsoft", name="fm"))
    m.graph.node.append(helper.make_node("TRT_Attention", ["z"], ["a"], domain="trt", name="ta"))
    m.graph.output[0].name = "a"
    m.opset_import.extend([helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("trt", 1)])
    validate.check(m, "m")
    path = save_external(relu_model(), tmp_path / "ext.onnx")
    validate.check(onnxio.load(path, load_external_data=False), "ext")
    m.opset_import.pop()  # trt no longer imported: a node in an undeclared domain
    with pytest.raises(TrtattnError, match="node 'ta' .* domain 'trt', which the model does not import"):
        validate.check(m, "m")


def test_op_missing_at_the_models_opset():
    m = relu_model()
    m.graph.node.append(helper.make_node("Gelu", ["y"], ["g"], name="gelu"))  # Gelu is opset 20
    m.graph.output[0].name = "g"
    with pytest.raises(TrtattnError, match="'Gelu' does not exist at opset 17"):
        validate.check(m, "m")


def test_invalid_output_is_never_written(tmp_path):
    m = relu_model()
    m.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, None))
    with pytest.raises(TrtattnError, match="not writing .*out.onnx.*'ghost'"):
        onnxio.save(m, tmp_path / "out.onnx")
    good = tmp_path / "good.onnx"
    onnx.save(relu_model(), str(good))
    with pytest.raises(TrtattnError, match="'ghost'"):
        onnxio.copy_model(good, tmp_path / "copy.onnx", m)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.onnx"]


# ---------------------------------------------------------------- paths and values
def _paths(tmp):
    model = tmp / "m.onnx"
    onnx.save(relu_model(), str(model))
    (tmp / "afile").write_text("x")
    (tmp / "adir.onnx").mkdir()
    (tmp / "exists.onnx").write_text("x")
    return model


@pytest.mark.parametrize("output,extra,expected", [
    ("afile/out.onnx", [], "afile is not a directory"),
    ("afile/deeper/out.onnx", [], "afile is not a directory"),
    ("adir.onnx", [], "is a directory"),
    ("exists.onnx", [], "pass --force"),
    ("m.onnx", ["--force"], "refusing to write over the input"),
    ("out.onnx", ["--report", "afile/r.json"], "afile is not a directory"),
])
def test_bad_output_path_is_one_line(tmp_path, output, extra, expected):
    model = _paths(tmp_path)
    extra = [str(tmp_path / e) if "/" in e else e for e in extra]
    _refused(["fuse", model, "-o", tmp_path / output, *extra], [model], tmp_path, expected)


@pytest.mark.parametrize("argv,expected", [
    (["fuse", "M", "-o", "O", "--atol", "-1"], "--atol"),
    (["fuse", "M", "-o", "O", "--atol", "nan"], "--atol"),
    (["fuse", "M", "-o", "O", "--atol", "inf"], "--atol"),
    (["normalize", "M", "-o", "O", "--seed", "-1"], "--seed"),
    (["fuse", "M", "-o", "O", "--dims", "seq=-1"], "--dims"),
    (["fuse", "M", "-o", "O", "--dims", "seq=x"], "--dims"),
    (["fuse", "M", "-o", "O", "--dims", "seq"], "--dims"),
    (["fuse", "M", "-o", "O", "--max-memory", "12Q"], "--max-memory"),
    (["fuse", "M", "-o", "O", "--max-memory", "0"], "--max-memory"),
    (["verify", "M", "--onnx", "M", "--iterations", "0"], "--iterations"),
    (["run", "M", "--seed", "-2"], "--seed"),
    (["bench", "M", "--iterations", "0"], "--iterations"),
    (["build", "M", "--max-batch", "0"], "--max-batch"),
])
def test_bad_value_is_refused_before_work(tmp_path, argv, expected):
    model = tmp_path / "m.onnx"
    onnx.save(relu_model(), str(model))
    argv = [str(model) if a == "M" else str(tmp_path / "o.onnx") if a == "O" else a for a in argv]
    line = _refused(argv, [model], tmp_path, expected)
    assert line.startswith("trtattn")


# ---------------------------------------------------------------- full disk, kills, stale scratch
def _limited(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG, as on a full disk
    return preexec


def _env():
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'plugins'}", "OMP_NUM_THREADS": "1"}


def test_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    model = save_external(relu_model(256), tmp_path / "m.onnx")  # 256 KB of weights
    before = tree(tmp_path)
    out = tmp_path / "out" / "copy.onnx"
    proc = subprocess.run([sys.executable, "-m", "trtattn", "-q", "fuse", model, "-o", out], env=_env(),
                          capture_output=True, text=True, preexec_fn=_limited(64 << 10), timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no space left writing {out}" in lines[0], proc.stderr
    assert tree(tmp_path) == before  # the folder made for the output is gone too


def test_stale_scratch_of_a_killed_run_is_removed(tmp_path):
    """A scratch folder of a dead process (pid in its name), in the target folder and in the temp folder,
    holding a hard link to the user's weights, is removed by the next run; a live process's is kept."""
    weights = tmp_path / "weights.data"
    weights.write_bytes(b"w" * 4096)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale_out = tmp_path / f".out.onnx.trtattn-{dead.pid}-abc"
    stale_out.mkdir()
    (stale_out / "out.onnx.data").write_bytes(b"partial")
    stale_tmp = Path(tempfile.gettempdir()) / f"trtattn-{dead.pid}-session-xyz"
    stale_tmp.mkdir()
    os.link(weights, stale_tmp / "weights.data")
    live = tmp_path / f".out.onnx.trtattn-{os.getppid()}-live.tmp"
    live.write_text("another run's")
    assert os.stat(weights).st_nlink == 2
    onnxio.save(relu_model(), tmp_path / "out.onnx", external_data=True)
    with onnxio.scratch_dir("session"):
        pass
    assert not stale_out.exists() and not stale_tmp.exists() and live.exists()
    assert os.stat(weights).st_nlink == 1 and weights.read_bytes() == b"w" * 4096
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "out.onnx", "out.onnx.data", "weights.data"])


@pytest.mark.slow
def test_sigkill_during_a_fuse_leaves_no_output_or_a_complete_one(tmp_path):
    """A real fuse of a model with 64 MB of external data, killed at several moments (during the work,
    as its scratch folder appears in the target folder, as the data file lands, after it ends)."""
    model = save_external(attention_model(heads=16, head=128), tmp_path / "m.onnx")
    digest = tree(tmp_path)
    moments = [("after", 1.0), ("scratch", None), ("data", None), ("done", None)]
    for k, (moment, delay) in enumerate(moments):
        out_dir = tmp_path / f"out{k}"
        out_dir.mkdir()
        out = out_dir / "f.onnx"
        proc = subprocess.Popen([sys.executable, "-m", "trtattn", "-q", "fuse", model, "-o", out], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        start = time.time()
        while proc.poll() is None and time.time() - start < 300:
            names = [p.name for p in out_dir.iterdir()]
            if (moment == "after" and time.time() - start > delay) or (moment == "scratch" and names) or \
                    (moment == "data" and "f.onnx.data" in names):
                break
            time.sleep(0.001)
        if moment != "done":
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        names = sorted(p.name for p in out_dir.iterdir())
        if "f.onnx" in names:  # complete: valid, with all its data
            validate.check(onnxio.load(out), str(out))
        else:
            assert "f.onnx.data" not in names or moment == "data", names
        onnxio.remove_stale(out_dir)  # what the next run writing there does first
        onnxio.remove_stale(tempfile.gettempdir())
        assert set(p.name for p in out_dir.iterdir()) <= {"f.onnx", "f.onnx.data"}
        assert not [p for p in Path(tempfile.gettempdir()).glob(f"trtattn-{proc.pid}-*")]
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("out")} == digest


# ---------------------------------------------------------------- memory
def test_activation_estimate_grows_with_the_attention_matrix():
    m = attention_model()
    small = memory.activation_bytes(m, {"batch": 2, "seq": 64})
    big = memory.activation_bytes(m, {"batch": 2, "seq": 4096})
    # [2, 4, 4096, 4096] fp32 scores alone are 512 MB
    assert big >= 2 * 4 * 4096 * 4096 * 4 and small < 4 << 20


def test_dims_search_skips_probes_over_the_budget():
    """A model that runs only at a length past the budget: the search skips it without a run and says so."""
    m = attention_model()
    reshape = helper.make_node("Reshape", ["x", "target"], ["x_fixed"], name="needs_512k")
    target = onnx.numpy_helper.from_array(np.array([-1, 1024, 32], np.int64), "target")  # seq: 512 k
    for n in m.graph.node:
        n.input[:] = ["x_fixed" if i == "x" else i for i in n.input]
    m.graph.node.insert(0, reshape)
    m.graph.initializer.append(target)
    del m.metadata_props[:]  # no declared dims: the search runs
    memory.set_budget(8 << 20)  # [1, 4, 1024, 1024] fp32 scores alone are 16 MB
    try:
        with pytest.raises(TrtattnError, match="skipped for memory, over 8.0M"):
            fit_dims(m, {"batch": 2})
        memory.set_budget(1 << 30)
        assert fit_dims(m, {"batch": 2})["seq"] in (512, 1024)  # the same search with room finds one
    finally:
        memory.set_budget(None)


def test_dims_over_the_budget_are_refused_in_one_line(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(attention_model(), str(model))
    _refused(["fuse", model, "-o", tmp_path / "o.onnx", "--dims", "seq=8192", "--max-memory", "256M"], [model],
             tmp_path, "over the memory budget of 256.0M")
    memory.set_budget(None)


def test_default_budget_is_a_fraction_of_available_memory_capped(monkeypatch):
    monkeypatch.delenv(memory.BUDGET_ENV, raising=False)
    monkeypatch.setattr(memory, "available_memory", lambda: 2 << 30)
    assert memory.budget() == 512 << 20
    monkeypatch.setattr(memory, "available_memory", lambda: 64 << 30)
    assert memory.budget() == memory.DEFAULT_CAP <= 1 << 30
    monkeypatch.setenv(memory.BUDGET_ENV, "8G")
    assert memory.budget() == 8 << 30


def test_slicing_decision_at_half_the_available_memory(monkeypatch):
    monkeypatch.delenv(slices.SLICE_ENV, raising=False)
    m = relu_model(1024)  # 4 MB of fp32 weights
    weights = slices.resident_size(m)
    assert slices.slice_budget(m, available=2 * weights + 2) is None  # at most half: whole
    assert slices.slice_budget(m, available=2 * weights - 2) is not None  # over half: sliced
    assert slices.slice_budget(m, available=int(1.5 * weights)) is not None  # more than available/2, less than 2x


def test_a_search_that_would_blow_up_stays_small(tmp_path):
    """A 20 KB model that runs only at a length of 16384 or more (its attention matrix: 17 GB there): the
    dims search skips those lengths for memory; the whole run peaks far below 2 GB (getrusage of the child)."""
    m = attention_model()
    m.graph.node.insert(0, helper.make_node("Reshape", ["x", "target"], ["x_fixed"], name="needs_16k"))
    for n in m.graph.node[1:]:
        n.input[:] = ["x_fixed" if i == "x" else i for i in n.input]
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1, 32768, 32], np.int64), "target"))
    del m.metadata_props[:]
    model = tmp_path / "long.onnx"
    onnx.save(m, str(model))
    proc = subprocess.run([sys.executable, "-m", "trtattn", "-q", "fuse", model, "-o", tmp_path / "o.onnx"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10
    assert proc.returncode == 2 and "skipped for memory" in proc.stderr, proc.stderr
    assert peak < 1 << 30, f"peak {peak >> 20} MB"


def test_a_failed_write_leaves_neither_a_temporary_nor_the_target(tmp_path):
    """atomic_write and copy_model stage through a temporary beside the target: a write that fails midway
    (here the data cannot be written) removes it, and the old target, if any, stays as it was."""
    target = tmp_path / "out" / "r.json"
    with pytest.raises(TypeError):
        onnxio.atomic_write(target, object())  # type: ignore[arg-type]
    assert not target.exists() and not [p for p in tmp_path.rglob("*") if p.is_file()]
    target.parent.mkdir()  # (the failed write removed the folder it had made for the target)
    target.write_text("old")
    with pytest.raises(TypeError):
        onnxio.atomic_write(target, object())  # type: ignore[arg-type]
    assert target.read_text() == "old" and [p.name for p in target.parent.iterdir()] == ["r.json"]
