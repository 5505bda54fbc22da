"""ONNX Runtime GenAI folders through `fuse DIR` (trtattn.folder_genai, issue 34 failure 2): genai_config.json
made to match the fused decoder, every other file copied. The folder is built by hand in the builder's layout
(model.onnx with a GroupQueryAttention decoder, past_key_values.%d.* in, present.%d.* out, genai_config.json,
a tokenizer file); tests/test_genai.py runs the real builder and ONNX Runtime GenAI."""

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
from trtattn.testing.contrib_graphs import group_query_decoder

DIMS = {"sequence_length": 1, "past_sequence_length": 5, "batch": 1}
NAMES = {"past_key": "past_key_values.0.key", "past_value": "past_key_values.0.value",
         "present_key": "present.0.key", "present_value": "present.0.value"}


def _renamed(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder with its caches named as GenAI's builder names them."""
    for value in [*model.graph.input, *model.graph.output]:
        value.name = NAMES.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [NAMES.get(n, n) for n in node.input]
        node.output[:] = [NAMES.get(n, n) for n in node.output]
    return model


def _config(share: bool, filename: str = "model.onnx") -> dict:
    return {"model": {"type": "llama", "context_length": 64, "decoder": {
                "filename": filename, "head_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_hidden_layers": 1,
                "inputs": {"input_ids": "input_ids", "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "y", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"}}},
            "search": {"max_length": 64, "do_sample": False, SHARE_BUFFER: share}}


def _folder(root, share=True):
    folder = root / "genai"
    folder.mkdir()
    onnx.save(_renamed(group_query_decoder()), str(folder / "model.onnx"))
    (folder / "genai_config.json").write_text(json.dumps(_config(share), indent=2))
    (folder / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')
    return folder


def test_fused_decoder_turns_the_shared_buffer_off_with_a_note(tmp_path):
    folder = _folder(tmp_path)
    result = fuse_folder(folder, tmp_path / "out", dims=DIMS)
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
    fuse_folder(folder, tmp_path / "out", dims=DIMS)
    rng = np.random.default_rng(0)
    past = rng.standard_normal((1, 2, 16, 16)).astype(np.float32)
    feeds = {"input_ids": np.array([[3]]), "past_key_values.0.key": past, "past_key_values.0.value": past,
             "seqlens_k": np.array([5]), "total_sequence_length": np.array(6)}
    lengths = {}
    for name in ("genai", "out"):
        session = ort.InferenceSession(str(tmp_path / name / "model.onnx"), providers=["CPUExecutionProvider"])
        present = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))["present.0.key"]
        lengths[name] = present.shape[2]
    assert lengths == {"genai": 16, "out": 17}
    assert presents_not_in_place(folder / "model.onnx", ["present.%d.key", "present.%d.value"]) == []
    assert presents_not_in_place(tmp_path / "out" / "model.onnx", ["present.%d.key"]) == ["present.0.key <- Attention"]


def test_config_without_a_shared_buffer_is_copied_byte_for_byte(tmp_path):
    folder = _folder(tmp_path, share=False)
    result = fuse_folder(folder, tmp_path / "out", dims=DIMS)
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


def test_decoder_files_of_a_pipeline():
    config = {"model": {"decoder": {"pipeline": [{"embeddings": {"filename": "embed.onnx"}},
                                                 {"transformer": {"filename": "layers.onnx"}}]}}}
    assert decoder_files(config) == ["embed.onnx", "layers.onnx"]


def test_cli_fuse_folder_prints_the_note_and_reports_it(tmp_path, capsys):
    folder = _folder(tmp_path)
    rc = main(["fuse", str(folder), "-o", str(tmp_path / "out"), "--dims",
               ",".join(f"{k}={v}" for k, v in DIMS.items()), "--report", str(tmp_path / "report.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"note: genai_config.json: search.{SHARE_BUFFER} true -> false" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["notes"]) == 1 and SHARE_BUFFER in report["notes"][0]

