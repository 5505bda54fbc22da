"""ONNX Runtime GenAI folders through `fuse DIR` (trtattn.folder_genai, issue 34 failure 2): genai_config.json
made to match the fused decoder, every other file copied. The folder is built by hand in the builder's layout
(testing/genai_graphs.py's decoder: GroupQueryAttention on packed QKV with rotary inside, the builder's norm
ops, past_key_values.%d.* in, present.%d.* out; its genai_config.json; a tokenizer file); tests/test_genai.py
runs the real builder and ONNX Runtime GenAI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trtattn.cli import main
from trtattn.errors import TrtattnError
from trtattn.folder import fuse_folder
from trtattn.folder_genai import SHARE_BUFFER, adapt_config, decoder_files, presents_not_in_place
from trtattn.testing.genai_graphs import GenaiSpec, genai_config, shared_buffer_logits, write_genai_folder

SPEC = GenaiSpec(norms="microsoft")  # the builder's norm ops, as its folders have them


def _config(share: bool, filename: str = "model.onnx") -> dict:
    return genai_config(SPEC, filename=filename, share_buffer=share)


def _folder(root, share=True):
    folder = write_genai_folder(root / "genai", SPEC, share_buffer=share)
    (folder / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')
    return folder


def test_fused_decoder_keeps_the_shared_buffer(tmp_path):
    """A shared-buffer folder's decoder fused with its presents written into the buffer: the config as it came."""
    folder = _folder(tmp_path)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok and result.output == tmp_path / "out" and not result.notes, result.notes
    actions = {f.path: f.action for f in result.files}
    assert actions == {"model.onnx": "fused", "genai_config.json": "copied", "tokenizer.json": "copied"}
    for name in ("genai_config.json", "tokenizer.json"):
        assert (tmp_path / "out" / name).read_bytes() == (folder / name).read_bytes()


def test_fused_decoder_presents_are_the_buffer_with_the_new_keys(tmp_path):
    """Measured as GenAI feeds it (a buffer of 16 slots, 5 keys valid, one new token): the fused present is the
    buffer's length, as GroupQueryAttention's, the same first 6 slots, the new key at slot 5 and every other slot
    kept (a kernel given no shared buffer leaves the slots past its 6 keys unwritten)."""
    folder = _folder(tmp_path)
    fuse_folder(folder, tmp_path / "out")
    rng = np.random.default_rng(0)
    past = rng.standard_normal((1, SPEC.kv_heads, 16, SPEC.head_size)).astype(np.float32)
    feeds = {"input_ids": np.array([[3]]), "attention_mask": np.ones((1, 6), np.int64)}
    feeds.update({f"past_key_values.{i}.{kv}": past for i in range(SPEC.layers) for kv in ("key", "value")})
    presents = {}
    for name in ("genai", "out"):
        session = ort.InferenceSession(str(tmp_path / name / "model.onnx"), providers=["CPUExecutionProvider"])
        presents[name] = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))["present.0.key"]
    assert presents["genai"].shape == presents["out"].shape == past.shape
    np.testing.assert_allclose(presents["out"][:, :, :6], presents["genai"][:, :, :6], atol=1e-5)
    np.testing.assert_array_equal(np.delete(presents["out"], 5, axis=2), np.delete(past, 5, axis=2))
    assert presents_not_in_place(tmp_path / "out" / "model.onnx", ["present.%d.key"]) == [
        "present.0.key <- GatherElements", "present.1.key <- GatherElements"]


def test_a_decoder_writing_a_present_by_concat_turns_the_shared_buffer_off_with_a_note(tmp_path):
    """A present the original writes by Concat (no GroupQueryAttention) is past + new long: the buffer cannot be
    shared, and the config written says why."""
    from onnx import TensorProto, helper, save

    folder = tmp_path / "genai"
    folder.mkdir()
    cache = ["b", 2, "p", 16]
    save(helper.make_model(helper.make_graph(
        [helper.make_node("Concat", ["past_key_values.0.key", "new"], ["present.0.key"], axis=2)], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, cache) for n in ("past_key_values.0.key", "new")],
        [helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, cache)])), folder / "model.onnx")
    source = folder / "genai_config.json"
    source.write_text(json.dumps(_config(share=True)))
    written = tmp_path / "out" / "genai_config.json"
    changes = adapt_config(source, written, rewritten={"model.onnx"})
    assert [(c.key, c.old, c.new) for c in changes] == [(f"search.{SHARE_BUFFER}", True, False)]
    assert "present.0.key <- Concat" in changes[0].note()
    expected = _config(share=True)
    expected["search"][SHARE_BUFFER] = False
    assert json.loads(written.read_text()) == expected  # that one setting, every other kept


def test_config_without_a_shared_buffer_is_copied_byte_for_byte(tmp_path):
    folder = _folder(tmp_path, share=False)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok and not result.notes
    assert {f.path: f.action for f in result.files}["genai_config.json"] == "copied"
    assert (tmp_path / "out" / "genai_config.json").read_bytes() == (folder / "genai_config.json").read_bytes()


def test_config_of_a_decoder_written_as_read_keeps_the_shared_buffer(tmp_path):
    """A decoder the run did not change still writes in place, as does one of GroupQueryAttention rewritten (its
    presents written into the buffer): the config is kept as it is."""
    folder = _folder(tmp_path)
    source = folder / "genai_config.json"
    assert adapt_config(source, tmp_path / "written" / "genai_config.json", rewritten=set()) == []
    assert adapt_config(source, tmp_path / "written" / "genai_config.json", rewritten={"model.onnx"}) == []
    assert not (tmp_path / "written").exists()


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
    """A window layer fused in a folder whose buffer is not shared: the note GenAI cannot feed it, printed and
    reported."""
    folder = write_genai_folder(tmp_path / "genai", GenaiSpec(norms="microsoft", window=8, sliding=(0,)))
    rc = main(["fuse", str(folder), "-o", str(tmp_path / "out"), "--report", str(tmp_path / "report.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "note: genai_config.json: the sliding_window layers [0]" in out
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


def test_fused_window_folder_keeps_the_shared_buffer_and_decodes_over_it(tmp_path):
    """Gemma 2's layout (a sliding layer with its window buffer, a global layer) fused in a shared-buffer folder: no
    note, the config kept, and decoded with every past and present bound to one buffer (testing/genai_graphs.py,
    as GenAI binds them) from a prompt longer than the window, the original's logits."""
    spec = GenaiSpec(norms="microsoft", window=8, sliding=(0,))
    folder = write_genai_folder(tmp_path / "genai", spec, share_buffer=True)
    result = fuse_folder(folder, tmp_path / "out")
    assert result.ok and not result.notes, result.notes
    assert json.loads((tmp_path / "out" / "genai_config.json").read_text())["search"][SHARE_BUFFER] is True
    prompt = list(range(3, 15))
    want, got = (shared_buffer_logits(onnx.load(str(d / "model.onnx")), spec, prompt, 10)
                 for d in (folder, tmp_path / "out"))
    np.testing.assert_allclose(np.stack(got), np.stack(want), atol=1e-4)


def test_fused_window_layers_unshared_are_written_with_a_note_that_genai_cannot_feed_them(tmp_path):
    """With the buffer not shared (as the config came), GenAI gives a window layer an empty first past, which the
    fused and the original model both refuse: the folder says so."""
    spec = GenaiSpec(norms="microsoft", window=8, sliding=(0,))
    result = fuse_folder(write_genai_folder(tmp_path / "genai", spec), tmp_path / "out")
    assert result.ok
    window, = result.notes
    assert "sliding_window layers [0]" in window and "at least 8 slots" in window
    assert "present.0.key <- GatherElements" in window


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
