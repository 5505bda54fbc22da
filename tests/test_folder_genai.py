"""ONNX Runtime GenAI folders through `fuse DIR` (trtattn.folder_genai, issue 34 failure 2): genai_config.json
made to match the fused decoder, every other file copied. The folder is built by hand in the builder's layout
(testing/genai_graphs.py's decoder: GroupQueryAttention on packed QKV with rotary inside, the builder's norm
ops, past_key_values.%d.* in, present.%d.* out; its genai_config.json; a tokenizer file); tests/test_genai.py
runs the real builder and ONNX Runtime GenAI."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from trtattn.cli import main
from trtattn.errors import TrtattnError
from trtattn.folder import fuse_folder
from trtattn.folder_genai import SHARE_BUFFER, adapt_config, decoder_files, presents_not_in_place
from trtattn.testing.genai_graphs import GenaiSpec, genai_config, write_genai_folder

SPEC = GenaiSpec(norms="microsoft")  # the builder's norm ops, as its folders have them


def _config(share: bool, filename: str = "model.onnx") -> dict:
    return genai_config(SPEC, filename=filename, share_buffer=share)


def _folder(root, share=True):
    folder = write_genai_folder(root / "genai", SPEC, share_buffer=share)
    (folder / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')
    return folder


def test_fused_decoder_turns_the_shared_buffer_off_with_a_note(tmp_path):
    folder = _folder(tmp_path)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok and result.output == tmp_path / "out"
    actions = {f.path: f.action for f in result.files}
    assert actions == {"model.onnx": "fused", "genai_config.json": "adapted", "tokenizer.json": "copied"}
    written = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    expected = _config(share=True)
    expected["search"][SHARE_BUFFER] = False
    assert written == expected  # that one setting, every other kept
    assert len(result.notes) == 1 and SHARE_BUFFER in result.notes[0] and "Concat(past, new)" in result.notes[0]
    assert "present.0.key <- Attention" in result.notes[0]
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert result.report()["notes"] == result.notes


def test_fused_decoder_presents_grow_by_the_new_tokens(tmp_path):
    """Why the buffer cannot be shared, measured: the fused present is past + new long, GroupQueryAttention's
    (fed a buffer of the context length, as GenAI does) is the buffer itself."""
    folder = _folder(tmp_path)
    fuse_folder(folder, tmp_path / "out")
    rng = np.random.default_rng(0)
    past = rng.standard_normal((1, SPEC.kv_heads, 16, SPEC.head_size)).astype(np.float32)
    feeds = {"input_ids": np.array([[3]]), "attention_mask": np.ones((1, 6), np.int64)}
    feeds.update({f"past_key_values.{i}.{kv}": past for i in range(SPEC.layers) for kv in ("key", "value")})
    lengths = {}
    for name in ("genai", "out"):
        session = ort.InferenceSession(str(tmp_path / name / "model.onnx"), providers=["CPUExecutionProvider"])
        present = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))["present.0.key"]
        lengths[name] = present.shape[2]
    assert lengths == {"genai": 16, "out": 17}
    assert presents_not_in_place(folder / "model.onnx", ["present.%d.key", "present.%d.value"]) == []
    assert presents_not_in_place(tmp_path / "out" / "model.onnx", ["present.%d.key"]) == [
        "present.0.key <- Attention", "present.1.key <- Attention"]


def test_config_without_a_shared_buffer_is_copied_byte_for_byte(tmp_path):
    folder = _folder(tmp_path, share=False)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok and not result.notes
    assert {f.path: f.action for f in result.files}["genai_config.json"] == "copied"
    assert (tmp_path / "out" / "genai_config.json").read_bytes() == (folder / "genai_config.json").read_bytes()


def test_config_of_a_decoder_written_as_read_keeps_the_shared_buffer(tmp_path):
    """A decoder the run did not change still writes in place: the config is copied as it is."""
    folder = _folder(tmp_path)
    source = tmp_path / "config.json"
    source.write_text(json.dumps(_config(share=True)))
    assert adapt_config(source, tmp_path / "written" / "genai_config.json", rewritten=set()) == []
    assert not (tmp_path / "written").exists()
    changes = adapt_config(source, folder / "again.json", rewritten={"model.onnx"})
    assert changes == []  # the GroupQueryAttention decoder itself writes in place: nothing to change


def test_config_naming_a_decoder_the_folder_lacks_is_refused(tmp_path):
    source = tmp_path / "genai_config.json"
    source.write_text(json.dumps(_config(share=True, filename="decoder.onnx")))
    with pytest.raises(TrtattnError, match="names the decoder decoder.onnx"):
        adapt_config(source, tmp_path / "out" / "genai_config.json", rewritten={"decoder.onnx"})


@pytest.mark.parametrize("text, why", [("{not json", "not a readable genai_config.json"),
                                       ('{"search": {}}', "without a 'model' section")])
def test_an_unreadable_config_is_one_line_naming_it(tmp_path, text, why):
    source = tmp_path / "genai_config.json"
    source.write_text(text)
    with pytest.raises(TrtattnError, match=f"{source}: .*{why}"):
        adapt_config(source, tmp_path / "out" / "genai_config.json", rewritten={"model.onnx"})


def test_decoder_files_of_a_pipeline():
    config = {"model": {"decoder": {"pipeline": [{"embeddings": {"filename": "embed.onnx"}},
                                                 {"transformer": {"filename": "layers.onnx"}}]}}}
    assert decoder_files(config) == ["embed.onnx", "layers.onnx"]


def test_cli_fuse_folder_prints_the_note_and_reports_it(tmp_path, capsys):
    folder = _folder(tmp_path)
    rc = main(["fuse", str(folder), "-o", str(tmp_path / "out"), "--report", str(tmp_path / "report.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"note: genai_config.json: search.{SHARE_BUFFER} true -> false" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["notes"]) == 1 and SHARE_BUFFER in report["notes"][0]



def test_run_generate_on_the_fused_folder_equals_the_original(tmp_path, capsys):
    """Both folders generated by trtattn itself (sizes from genai_config.json): the same greedy tokens."""
    folder = _folder(tmp_path)
    fuse_folder(folder, tmp_path / "out")
    tokens = {}
    for name in ("genai", "out"):
        capsys.readouterr()
        assert main(["run", str(tmp_path / name), "--generate", "6", "--prompt", "5,9,17,3"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("request 0:"))
        tokens[name] = line.split(":", 1)[1].split()
    assert len(tokens["genai"]) >= 2 and tokens["out"] == tokens["genai"]


def test_fused_window_layers_are_written_with_a_note_that_genai_cannot_feed_them(tmp_path):
    """Gemma 2's sliding layer (decoder.sliding_window.layers) fused: its present is the window buffer (no
    concatenation, so not named as one), and with the buffer unshared for the global layer's sake the folder says
    GenAI cannot feed it."""
    spec = GenaiSpec(norms="microsoft", window=8, sliding=(0,))
    folder = write_genai_folder(tmp_path / "genai", spec, share_buffer=True)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok, result.notes
    shared, window = result.notes
    assert SHARE_BUFFER in shared and "present.1.key <- Attention" in shared and "present.0" not in shared
    assert "sliding_window layers [0]" in window and "at least 8 slots" in window
    assert "present.0.key <- GatherElements" in window
    rng = np.random.default_rng(0)
    feeds = {"input_ids": np.array([[3]]), "attention_mask": np.ones((1, 12), np.int64)}
    for layer, slots in ((0, 8), (1, 11)):
        feeds.update({f"past_key_values.{layer}.{kv}": rng.standard_normal((1, spec.kv_heads, slots, spec.head_size))
                      .astype(np.float32) for kv in ("key", "value")})
    got, want = (dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds))) for s in (
        ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"]) for d in (tmp_path / "out", folder)))
    assert got["present.0.key"].shape == want["present.0.key"].shape == (1, spec.kv_heads, 8, spec.head_size)
    np.testing.assert_allclose(got["present.0.key"], want["present.0.key"], atol=1e-6)
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-4)


def test_a_folder_without_window_layers_has_no_window_note(tmp_path):
    result = fuse_folder(_folder(tmp_path), tmp_path / "out")
    assert not any("sliding_window" in n for n in result.notes)


def test_run_generate_on_a_fused_window_folder_equals_the_original(tmp_path, capsys):
    """Gemma 2's sliding layer fused (rewrite/window_cache.py): trtattn's own generation feeds both folders a
    window buffer of window_size slots; a prompt longer than the window, the same greedy tokens."""
    spec = GenaiSpec(norms="microsoft", window=4, sliding=(0,))
    folder = write_genai_folder(tmp_path / "genai", spec)
    assert fuse_folder(folder, tmp_path / "out").ok
    tokens = {}
    for name in ("genai", "out"):
        capsys.readouterr()
        assert main(["run", str(tmp_path / name), "--generate", "8", "--prompt", "5,9,17,3,11,13", "--eos", "-1"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("request 0:"))
        tokens[name] = line.split(":", 1)[1].split()
    assert len(tokens["genai"]) == 8 and tokens["out"] == tokens["genai"]


def test_a_decoder_of_window_layers_only_keeps_the_shared_buffer(tmp_path):
    """Every fused present a window buffer (no concatenation): past and present still share one buffer, no note."""
    spec = GenaiSpec(norms="microsoft", layers=1, window=8, sliding=(0,))
    folder = write_genai_folder(tmp_path / "genai", spec, share_buffer=True)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok and not result.notes, result.notes
    assert json.loads((tmp_path / "out" / "genai_config.json").read_text())["search"][SHARE_BUFFER] is True
