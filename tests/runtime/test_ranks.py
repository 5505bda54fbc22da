"""Running a tensor-parallel rank set (runtime/ranks.py, cli/rank_set.py): what can be checked without GPUs
(the set read from its sidecars, each rank's command line and environment, the launcher's process
handling, the refusal on too few GPUs, the communicator's type against the real bindings), and on N GPUs
with TensorRT (`-m trt`) the set's outputs and tokens against the single-device engine's."""

import json
import sys
import time

import numpy as np
import pytest

from trtattn.cli import main
from trtattn.cli.rank_set import refuse, visible_gpus
from trtattn.errors import TrtattnError
from trtattn.runtime import ranks
from trtattn.runtime.ranks import RankCommand, launch, rank_commands, read_rank_set


def _rank_set(folder, n=2, name="m"):
    plan = folder / f"{name}.tp.json"
    plan.write_text(json.dumps({"tensor_parallel": n, "ranks": [{"rank": r, "engine": f"{name}.rank{r}of{n}.engine"}
                                                                for r in range(n)]}))
    for r in range(n):
        engine = folder / f"{name}.rank{r}of{n}.engine"
        engine.write_bytes(b"not an engine: never opened here")
        engine.with_suffix(".json").write_text(json.dumps({"tensor_parallel": {"rank": r, "ranks": n}}))
    return plan


def test_rank_set_is_read_from_its_sidecar_or_any_rank_engine(tmp_path):
    plan = _rank_set(tmp_path, 4)
    from_plan = read_rank_set(plan)
    from_engine = read_rank_set(tmp_path / "m.rank2of4.engine")
    expected = [tmp_path / f"m.rank{r}of4.engine" for r in range(4)]
    assert (from_plan.name, from_plan.ranks, from_plan.models, from_plan.needed) == ("m", 4, expected, expected)
    assert (from_engine.name, from_engine.ranks, from_engine.models) == ("m", 4, expected)
    single = tmp_path / "one.engine"
    single.write_bytes(b"x")
    single.with_suffix(".json").write_text(json.dumps({"name": "one"}))
    assert read_rank_set(single) is None and read_rank_set(tmp_path / "model.onnx") is None
    renamed = tmp_path / "renamed.engine"
    renamed.write_bytes(b"x")
    renamed.with_suffix(".json").write_text(json.dumps({"tensor_parallel": {"rank": 0, "ranks": 4}}))
    with pytest.raises(TrtattnError, match="not named NAME.rankRof4.engine"):
        read_rank_set(renamed)


def test_each_rank_gets_its_engine_device_and_the_meeting_point(tmp_path):
    plan = _rank_set(tmp_path, 2)
    argv = ["-q", "run", str(plan), "--generate", "4", "--prompt", "5,6", "--save", "out.npz"]
    env = {"PATH": "/bin", "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "2,3"}
    commands = rank_commands(read_rank_set(plan), argv, str(plan), port=29511, command="run", python="py", env=env)
    assert [c.argv for c in commands] == [
        ["py", "-m", "trtattn", *(["-q"] if r else []), "-q", "run", str(tmp_path / f"m.rank{r}of2.engine"),
         "--generate", "4", "--prompt", "5,6", "--save", "out.npz"] for r in range(2)]
    assert [c.env_shown() for c in commands] == [
        {"TRTATTN_RANK": str(r), "TRTATTN_RANKS": "2", "TRTATTN_DEVICE": str(r), "NCCL_COMM_ID": "127.0.0.1:29511"}
        for r in range(2)]
    # the user's NCCL settings and choice of GPUs go to every rank; an NCCL_COMM_ID of theirs is kept
    assert all(c.env["NCCL_DEBUG"] == "WARN" and c.env["CUDA_VISIBLE_DEVICES"] == "2,3" for c in commands)
    kept = rank_commands(read_rank_set(plan), argv, str(plan), port=1, command="run", env={**env, "NCCL_COMM_ID": "h:7"})
    assert {c.env["NCCL_COMM_ID"] for c in kept} == {"h:7"}
    # the model after the sub-command is the one replaced, not an equal value elsewhere on the line
    first = rank_commands(read_rank_set(plan), ["bench", str(plan), "--inputs", str(plan)], str(plan), port=1,
                          command="bench", python="py")
    assert [c.argv for c in first] == [
        ["py", "-m", "trtattn", *q, "bench", str(tmp_path / f"m.rank{r}of2.engine"), "--inputs", str(plan)]
        for r, q in enumerate(([], ["-q"]))]
    (tmp_path / "m.rank1of2.engine").unlink()
    with pytest.raises(TrtattnError, match="rank engine .*m.rank1of2.engine not found"):
        rank_commands(read_rank_set(plan), argv, str(plan), port=1, command="run")


def test_a_built_folder_runs_as_one_rank_set_each_rank_taking_its_engines(tmp_path, monkeypatch):
    """`build DIR --tp 2` writes pipeline.json naming each part's rank engines: every rank process is given
    the folder and load_pipeline takes that rank's engine of each part."""
    from trtattn.runtime.pipeline import load_pipeline

    out = tmp_path / "out"
    out.mkdir()
    roles = ("encoder", "decoder", "decoder_with_past")
    parts = {role: {"form": "padded", "onnx": f"{role}.padded.onnx", "file": None, "plan": f"{role}.tp.json",
                    "ranks": [f"{role}.rank{r}of2.engine" for r in range(2)]} for role in roles}
    (out / "pipeline.json").write_text(json.dumps({"tensor_parallel": 2, "kind": "encoder-decoder", "parts": parts}))
    for role in roles:
        for r in range(2):
            (out / f"{role}.rank{r}of2.engine").write_bytes(b"x")
    rank_set = read_rank_set(out)
    assert (rank_set.ranks, rank_set.models, len(rank_set.needed)) == (2, [out, out], 6)
    commands = rank_commands(rank_set, ["run", str(out), "--generate", "3"], str(out), port=5, command="run",
                             python="py")
    assert [c.argv for c in commands] == [["py", "-m", "trtattn", *q, "run", str(out), "--generate", "3"]
                                          for q in ([], ["-q"])]
    monkeypatch.setenv(ranks.RANK_ENV, "1")
    monkeypatch.setenv(ranks.RANKS_ENV, "2")
    assert load_pipeline(out).parts == {role: out / f"{role}.rank1of2.engine" for role in roles}
    monkeypatch.setenv(ranks.RANKS_ENV, "4")
    with pytest.raises(TrtattnError, match="a set of 2 ranks, but this process was launched as rank 1 of 4"):
        load_pipeline(out)


def test_too_few_gpus_refused_in_one_line(tmp_path, capsys):
    plan = _rank_set(tmp_path, 4)
    for target in (plan, tmp_path / "m.rank0of4.engine"):
        assert refuse(str(target), gpus=1) == 4
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs 4 GPUs, this machine has 1" in err[0]
    assert refuse(str(plan), gpus=4) is None
    assert refuse(str(tmp_path / "plain.onnx"), gpus=0) is None


@pytest.mark.parametrize("command", ["run", "bench"])
def test_cli_on_this_machine_refuses_before_any_work(tmp_path, capsys, command):
    """No GPU here: `run`/`bench` on the set say so in one line and exit 4, the engines never opened."""
    have = visible_gpus()
    if have >= 2:
        pytest.skip(f"this machine has {have} GPUs: the set would run")
    plan = _rank_set(tmp_path, 2)
    assert main(["-q", command, str(plan), "--generate", "2", "--prompt", "1,2"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"needs 2 GPUs, this machine has {have}" in err[0]


def _python(code: str, rank: int) -> RankCommand:
    return RankCommand(rank, [sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, rank)


def test_launcher_shows_rank0_and_ends_the_others_when_one_fails(tmp_path, capfd):
    ok = [_python(f"print('rank {r} done')", r) for r in range(3)]
    assert launch(ok) == 0
    out = capfd.readouterr().out
    assert "rank 0 done" in out and "rank 1 done" not in out and "rank 2 done" not in out
    # rank 1 fails while the others would wait forever (as in NCCL): its code, the others ended
    marker = tmp_path / "still-running"
    waiting = f"import time, pathlib; time.sleep(60); pathlib.Path({str(marker)!r}).write_text('x')"
    start = time.monotonic()
    code = launch([_python(waiting, 0), _python("import sys; sys.exit(3)", 1), _python(waiting, 2)])
    assert code == 3 and time.monotonic() - start < 30 and not marker.exists()
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert launch([_python(waiting, 0), _python(killed, 1)]) == 128 + 15


def test_a_rank_process_refuses_an_engine_of_another_rank(tmp_path, monkeypatch):
    """In a rank process the engine's sidecar must say the rank it was launched as, checked before CUDA."""
    _rank_set(tmp_path, 2)
    monkeypatch.setenv(ranks.RANK_ENV, "0")
    monkeypatch.setenv(ranks.RANKS_ENV, "2")
    with pytest.raises(TrtattnError, match="is rank 1 of 2, but this process was launched as rank 0 of 2"):
        ranks.session_options(tmp_path / "m.rank1of2.engine")
    assert ranks.session_options(tmp_path / "model.onnx") == {}
    assert not ranks.is_secondary_rank()
    monkeypatch.setenv(ranks.RANK_ENV, "1")
    assert ranks.is_secondary_rank()


@pytest.mark.conformance
def test_communicator_is_what_the_execution_context_takes(real_trt):
    """TensorRT 11.4's IExecutionContext.set_communicator takes one capsule (an ncclComm_t) and returns a
    bool; trt/nccl.py hands it a PyCapsule around the communicator's pointer."""
    from trtsim.signatures import parse_signatures

    from trtattn.trt.nccl import capsule

    (sig,) = parse_signatures(real_trt.IExecutionContext.set_communicator.__doc__)
    assert [(p.name, p.type.rsplit(".", 1)[-1]) for p in sig.params] == [("communicator", "CapsuleType")]
    assert sig.returns == "bool"
    assert type(capsule(0x1000)).__name__ == "PyCapsule"  # types.CapsuleType from Python 3.13
    with pytest.raises(TrtattnError, match="null pointer"):
        capsule(0)


@pytest.mark.trt
@pytest.mark.parametrize("n", [2])
def test_rank_set_on_gpus_equals_the_single_device_engine(tmp_path, n):
    """On N GPUs with TensorRT (docker/): the writer's tiny Llama built for one device and as N ranks. `run` on
    the set gives the single engine's logits (the padded form: no cache input, so both get the same feeds),
    and `run --generate` on the cache model's set its tokens (caches zero-filled per rank, its heads only)."""
    from trtattn.trt.session import trt_available

    ok, why = trt_available()
    if not ok or visible_gpus() < n:
        pytest.skip(f"needs {n} GPUs and TensorRT ({why or f'{visible_gpus()} GPUs visible'})")
    from trtattn.testing import write_llama

    out = tmp_path / "engines"
    common = ["--precision", "fp16", "--max-cache", "64", "--out-dir", str(out), "--force"]
    for form in ("padded", "cache"):
        model = write_llama.write_llama(tmp_path / f"{form}.onnx", **{**write_llama.PRESETS["tiny"], "form": form})
        assert main(["-q", "build", str(model), "--name", form, *common]) == 0
        assert main(["-q", "build", str(model), "--name", form, "--tp", str(n), *common]) == 0
    feeds = ["--dims", "batch=2,seq=5", "--seed", "1"]
    for target, save in ((out / "padded.engine", "one.npz"), (out / "padded.tp.json", "set.npz")):
        assert main(["-q", "run", str(target), *feeds, "--save", str(tmp_path / save)]) == 0
    with np.load(tmp_path / "one.npz") as one, np.load(tmp_path / "set.npz") as got:
        assert sorted(one.files) == sorted(got.files)
        for k in one.files:
            np.testing.assert_allclose(got[k].astype(np.float32), one[k].astype(np.float32), rtol=2e-2, atol=2e-2)
    generate = ["--generate", "6", "--prompt", "5,17,33", "--prompt", "7,8"]
    for target, save in ((out / "cache.engine", "one_t.npz"), (out / "cache.tp.json", "set_t.npz")):
        assert main(["-q", "run", str(target), *generate, "--save", str(tmp_path / save)]) == 0
    with np.load(tmp_path / "one_t.npz") as one, np.load(tmp_path / "set_t.npz") as got:
        assert np.array_equal(one["tokens"], got["tokens"])


@pytest.mark.trt
def test_folder_rank_set_on_gpus_generates_the_single_device_tokens(tmp_path):
    """On 2 GPUs with TensorRT (docker/): an export folder (the writer's tiny Llama with a cache as model.onnx)
    built for one device and over 2 ranks; `run OUT --generate` through the rank set gives the one-device
    folder's tokens."""
    from trtattn.trt.session import trt_available

    ok, why = trt_available()
    if not ok or visible_gpus() < 2:
        pytest.skip(f"needs 2 GPUs and TensorRT ({why or f'{visible_gpus()} GPUs visible'})")
    from trtattn.testing import write_llama

    folder = tmp_path / "export"
    folder.mkdir()
    write_llama.write_llama(folder / "model.onnx", **{**write_llama.PRESETS["tiny"], "form": "cache"})
    common = ["--precision", "fp16", "--max-cache", "64", "--force"]
    assert main(["-q", "build", str(folder), "--out-dir", str(tmp_path / "one"), *common]) == 0
    assert main(["-q", "build", str(folder), "--tp", "2", "--out-dir", str(tmp_path / "set"), *common]) == 0
    tokens = []
    for out in ("one", "set"):
        save = tmp_path / f"{out}.npz"
        assert main(["-q", "run", str(tmp_path / out / "export"), "--generate", "6", "--prompt", "5,17,33",
                     "--save", str(save)]) == 0
        with np.load(save) as data:
            tokens.append(data["tokens"])
    assert np.array_equal(tokens[0], tokens[1])


def test_a_sidecar_listing_fewer_engines_than_ranks_is_refused_naming_the_missing_one(tmp_path):
    """NAME.tp.json of 2 ranks listing only rank 0's engine: every rank still gets its engine by the set's
    naming, so the launch refuses naming rank 1's absent engine rather than launching one rank of two."""
    plan = _rank_set(tmp_path, 2)
    plan.write_text(json.dumps({"tensor_parallel": 2, "ranks": [{"rank": 0, "engine": "m.rank0of2.engine"}]}))
    (tmp_path / "m.rank1of2.engine").unlink()
    rank_set = read_rank_set(plan)
    assert rank_set.models == [tmp_path / f"m.rank{r}of2.engine" for r in range(2)]
    with pytest.raises(TrtattnError, match=r"rank engine \S*m\.rank1of2\.engine not found"):
        rank_commands(rank_set, ["run", str(plan)], str(plan), port=1, command="run", env={})


def test_nccl_missing_is_one_clear_error_naming_the_library():
    """No libnccl on this machine: loading it says which library is missing and how to get it, not ctypes' OSError."""
    import ctypes

    from trtattn.errors import MissingDependencyError
    from trtattn.trt import nccl

    for name in nccl.LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        pytest.skip(f"{name} is installed here")
    with pytest.raises(MissingDependencyError, match=r"needs NCCL \(libnccl\.so\.2 or libnccl\.so was not found\)"):
        nccl.load_library()
