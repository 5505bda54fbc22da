"""ONNX Runtime GenAI as the real client of fused folders (issue 34, failure 2).

Run in the GenAI venv (README: the GenAI environment): `.venv-genai/bin/python -m pytest -m genai
tests/test_genai.py`. Elsewhere these tests skip. Each family is a tiny random-weight transformers checkpoint
(no downloads) built by GenAI's own model builder (trtattn/testing/genai_builds.py), fused with `trtattn fuse
DIR`, then loaded by og.Model and decoded greedily: the fused folder's tokens are the original's."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest

pytest.importorskip("onnxruntime_genai", reason="needs onnxruntime-genai: run in .venv-genai "
                                                "(README: the GenAI environment)")
pytestmark = pytest.mark.genai

from trtattn.cli import main  # noqa: E402
from trtattn.folder_genai import SHARE_BUFFER  # noqa: E402
from trtattn.testing import genai_builds  # noqa: E402

FAMILIES = [("llama", "fp32"), ("qwen2", "int4")]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("genai")
    made = {}

    def get(family, precision):
        if (family, precision) not in made:
            source = genai_builds.checkpoint(family, root / "checkpoints" / family)
            made[family, precision] = genai_builds.build(source, root / f"{family}-{precision}", precision)
        return made[family, precision]

    return get


@pytest.fixture(scope="module")
def fused(built, tmp_path_factory):
    made = {}

    def get(family, precision):
        if (family, precision) not in made:
            out = tmp_path_factory.mktemp("fused") / f"{family}-{precision}"
            report = out.parent / "report.json"
            rc = main(["fuse", str(built(family, precision)), "-o", str(out), "--report", str(report)])  # as a user runs it
            made[family, precision] = (rc, out, json.loads(report.read_text()))
        return made[family, precision]

    return get


@pytest.mark.parametrize("family, precision", FAMILIES)
def test_fused_folder_generates_the_original_tokens_in_genai(built, fused, family, precision):
    folder = built(family, precision)
    assert json.loads((folder / "genai_config.json").read_text())["search"][SHARE_BUFFER] is True
    rc, out, report = fused(family, precision)
    assert rc == 0 and report["ok"], report["sites"]
    assert [s["status"] for s in report["sites"]] == ["fused", "fused"]  # one attention per layer
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
    assert "Attention" in ops and "GroupQueryAttention" not in ops
    # the presents written into GenAI's shared buffer (rewrite/group_query.py): the config as it came, no note
    assert (out / "genai_config.json").read_bytes() == (folder / "genai_config.json").read_bytes()
    assert not report["notes"], report["notes"]
    want = genai_builds.greedy_tokens(folder, new=NEW_TOKENS)
    assert len(want) == len(genai_builds.PROMPT) + NEW_TOKENS  # no early end: every step compared
    assert genai_builds.greedy_tokens(out, new=NEW_TOKENS) == want


def test_fused_models_with_the_buffer_unshared_also_generate_the_original_tokens(built, fused, tmp_path):
    """The fused form is right under both of GenAI's contracts: with past_present_share_buffer turned off GenAI
    passes the cache grown (past + new), where the write into the buffer is the concatenation itself."""
    rc, out, _ = fused("llama", "fp32")
    assert rc == 0
    unshared = tmp_path / "unshared"
    shutil.copytree(out, unshared)
    config = json.loads((unshared / "genai_config.json").read_text())
    config["search"][SHARE_BUFFER] = False
    (unshared / "genai_config.json").write_text(json.dumps(config))
    assert genai_builds.greedy_tokens(unshared, new=NEW_TOKENS) == genai_builds.greedy_tokens(
        built("llama", "fp32"), new=NEW_TOKENS)


def test_every_other_file_of_the_folder_is_copied(built, fused):
    folder = built("llama", "fp32")
    _, out, report = fused("llama", "fp32")
    actions = {f["file"]: f["action"] for f in report["files"]}
    assert actions.pop("model.onnx") == "fused"
    assert actions and set(actions.values()) == {"copied"}
    for name in actions:
        assert (out / name).read_bytes() == (folder / name).read_bytes(), name


@pytest.mark.parametrize("which", ["original", "fused"])
def test_run_folder_generate_equals_genai(built, fused, which, capsys):
    """`trtattn run DIR --generate` on a GenAI folder: sizes from genai_config.json, GenAI's tokens."""
    folder = built("llama", "fp32") if which == "original" else fused("llama", "fp32")[1]
    want = genai_builds.greedy_tokens(folder, new=NEW_TOKENS)[len(genai_builds.PROMPT):]
    capsys.readouterr()
    prompt = ",".join(map(str, genai_builds.PROMPT))
    assert main(["run", str(folder), "--generate", str(NEW_TOKENS), "--prompt", prompt]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("request 0:"))
    got = [int(t) for t in line.split(":", 1)[1].split()]
    eos = json.loads((folder / "genai_config.json").read_text())["model"]["eos_token_id"]
    end = got.index(eos) if eos in got else len(got)  # GenAI held the end off (min_length): compare up to it
    assert end >= 2 and got[:end] == want[:end]


@pytest.mark.parametrize("family, precision", FAMILIES)
def test_built_folder_generates_genai_tokens(built, family, precision, tmp_path, capsys):
    """`trtattn build DIR` then `trtattn run OUT --backend ort`: the verified kv-cache form, fed as the engine would
    be (write index, the keys' attention_mask GenAI's model still reads), generates GenAI's greedy tokens, and
    pipeline.json keeps genai_config.json's stop token and context length."""
    folder = built(family, precision)
    # fp32: the tokens are compared with GenAI's fp32 run (and AutoCast is not in this venv); 4 without TensorRT
    main(["build", str(folder), "--out-dir", str(tmp_path), "--precision", "fp32"])
    out = tmp_path / folder.name
    sidecar = json.loads((out / "pipeline.json").read_text())
    genai = json.loads((folder / "genai_config.json").read_text())
    assert sidecar["generation"]["eos_token_id"] == genai["model"]["eos_token_id"]
    assert sidecar["parts"]["decoder"]["form"] == "kv-cache"
    want = genai_builds.greedy_tokens(folder, new=NEW_TOKENS)[len(genai_builds.PROMPT):]
    capsys.readouterr()
    prompt = ",".join(map(str, genai_builds.PROMPT))
    assert main(["run", str(out), "--backend", "ort", "--generate", str(NEW_TOKENS), "--prompt", prompt]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("request 0:"))
    got = [int(t) for t in line.split(":", 1)[1].split()]
    eos = genai["model"]["eos_token_id"]
    end = got.index(eos) if eos in got else len(got)
    assert end >= 2 and got[:end] == want[:end]


LONG_PROMPT = [5, 9, 17, 3, 22, 7, 11, 13, 19, 23, 29, 31]  # longer than Gemma 2's window of 8 (genai_builds)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("prompt", [genai_builds.PROMPT, LONG_PROMPT], ids=["short", "longer-than-window"])
def test_gemma2_fused_folder_generates_genai_tokens_in_genai(built, fused, precision, prompt, capsys):
    """Gemma 2 (a sliding layer with its window buffer, a global layer) fused: both sites fused, the shared buffer
    kept with no note, and og.Generator on the fused folder generates the original's greedy tokens, as does
    `trtattn run`, which feeds the window buffer itself."""
    rc, out, report = fused("gemma2", precision)
    assert rc == 0 and [s["status"] for s in report["sites"]] == ["fused", "fused"], report["sites"]
    assert not report["notes"], report["notes"]
    assert json.loads((out / "genai_config.json").read_text())["search"][SHARE_BUFFER] is True
    want = genai_builds.greedy_tokens(built("gemma2", precision), prompt=prompt, new=NEW_TOKENS)
    assert len(want) == len(prompt) + NEW_TOKENS
    assert genai_builds.greedy_tokens(out, prompt=prompt, new=NEW_TOKENS) == want
    capsys.readouterr()
    assert main(["run", str(out), "--generate", str(NEW_TOKENS), "--prompt", ",".join(map(str, prompt)),
                 "--eos", "-1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("request 0:"))
    assert [int(t) for t in line.split(":", 1)[1].split()] == want[len(prompt):]


@pytest.mark.parametrize("new", [NEW_TOKENS, 30], ids=["buffer-of-max-length", "buffer-of-window-plus-16"])
def test_fused_window_layers_share_genai_buffer_and_generate_its_tokens(tmp_path, new):
    """A decoder of window layers only (hand-built, testing/genai_graphs.py) fused: every present is the window
    buffer, so past_present_share_buffer stays on, and GenAI itself feeds the fused model its buffer
    (min(window + 16, max_length) slots on CPU: more than the window, so the kernel's compaction is exercised
    from a prompt longer than the window): the original's greedy tokens."""
    from trtattn.folder import fuse_folder
    from trtattn.testing.genai_graphs import GenaiSpec, write_genai_folder

    folder = write_genai_folder(tmp_path / "genai", GenaiSpec(norms="microsoft", layers=1, window=8, sliding=(0,)),
                                share_buffer=True)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok and not result.notes, result.notes
    assert json.loads((tmp_path / "out" / "genai_config.json").read_text())["search"][SHARE_BUFFER] is True
    want = genai_builds.greedy_tokens(folder, prompt=LONG_PROMPT, new=new)
    assert len(want) == len(LONG_PROMPT) + new
    assert genai_builds.greedy_tokens(tmp_path / "out", prompt=LONG_PROMPT, new=new) == want
