"""runtime/genai_config.py and `run DIR --generate` on a folder ONNX Runtime GenAI's builder wrote: the cache's heads
and head size, the decoder's file and the stop tokens come from genai_config.json."""

import json

import numpy as np
import onnxruntime as ort
import pytest

from trtattn.cli import main
from trtattn.errors import TrtattnError
from trtattn.runtime.genai_config import read_genai_config
from trtattn.runtime.pipeline import load_pipeline
from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder, write_genai_config, write_genai_folder

PROMPT = [5, 6, 7, 8]


def _greedy(spec: GenaiSpec, prompt: list[int], n: int, eos: int) -> list[int]:
    """Greedy tokens by hand: a prefill with empty caches (a sliding layer's: its window of zeros, as GenAI gives
    it), then one token a step over the presents."""
    session = ort.InferenceSession(genai_decoder(spec).SerializeToString(), providers=["CPUExecutionProvider"])
    past = {f"past_key_values.{i}.{k}": np.zeros((1, spec.kv_heads, spec.window if i in spec.sliding else 0,
                                                  spec.head_size), spec.np_dtype)
            for i in range(spec.layers) for k in ("key", "value")}
    ids, tokens, length = np.asarray([prompt], np.int64), [], 0
    for _ in range(n):
        total = length + ids.shape[1]
        length = total
        out = session.run(None, {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past})
        past = dict(zip(past, out[1:]))
        tokens.append(int(out[0][0, -1].argmax()))
        if tokens[-1] == eos:
            break
        ids = np.asarray([[tokens[-1]]], np.int64)
    return tokens


def test_reads_what_the_builder_writes(tmp_path):
    spec = GenaiSpec(head_size=8, kv_heads=1, context_length=64)
    config = read_genai_config(write_genai_folder(tmp_path, spec))
    assert (config.head_size, config.kv_heads, config.heads, config.context_length) == (8, 1, 4, 64)
    assert config.filename == "model.onnx" and config.eos_token_id == 2 and not config.share_buffer
    assert read_genai_config(tmp_path / "model.onnx") == config  # beside a model file too
    assert config.as_hf_config()["head_dim"] == 8 and config.settings()["max_length"] == 64
    (tmp_path / "elsewhere").mkdir()
    assert read_genai_config(tmp_path / "elsewhere") is None and read_genai_config(tmp_path / "elsewhere" / "m.onnx") is None


def test_unreadable_config_is_one_line_naming_it(tmp_path):
    (tmp_path / "genai_config.json").write_text("{not json")
    with pytest.raises(TrtattnError, match="genai_config.json: not readable JSON"):
        read_genai_config(tmp_path)


def test_pipeline_takes_the_decoder_file_the_config_names(tmp_path):
    spec = GenaiSpec(layers=1)
    write_genai_folder(tmp_path, spec)
    (tmp_path / "model.onnx").rename(tmp_path / "decoder-int4.onnx")
    write_genai_config(tmp_path, spec, filename="decoder-int4.onnx")
    pipeline = load_pipeline(tmp_path)
    assert pipeline.parts["decoder"].name == "decoder-int4.onnx"
    assert pipeline.config["num_key_value_heads"] == spec.kv_heads and pipeline.settings["eos_token_id"] == 2


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_generate_on_a_genai_folder_gives_the_greedy_tokens(tmp_path, capsys, dtype):
    """Was: "cannot tell the heads and head size of past_key_values.0.key (dynamic dims, and config.json does not
    say)". The config's eos is set to a token the model does not pick first, so all 8 steps run."""
    spec = GenaiSpec(dtype=dtype)
    expected_any = _greedy(spec, PROMPT, 8, eos=-1)
    folder = write_genai_folder(tmp_path / "m", spec)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = expected_any[-1]  # stops there, or earlier where it comes up before
    (folder / "genai_config.json").write_text(json.dumps(config))
    expected = _greedy(spec, PROMPT, 8, eos=expected_any[-1])
    assert main(["-q", "run", str(folder), "--generate", "8", "--prompt", ",".join(map(str, PROMPT)), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in out["requests"]] == [expected], out


def test_a_folder_built_from_a_genai_folder_keeps_its_stop_tokens_and_heads(tmp_path, capsys):
    """`build DIR` on a GenAI folder: pipeline.json's generation settings and the built folder's config come from
    genai_config.json (the folder has no config.json nor generation_config.json), so `run OUT` stops where the
    original does. Was: genai_config.json not copied, pipeline.json's "generation" empty."""
    spec = GenaiSpec(layers=1)
    folder = write_genai_folder(tmp_path / "m", spec)
    expected_any = _greedy(spec, PROMPT, 8, eos=-1)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = expected_any[3]
    (folder / "genai_config.json").write_text(json.dumps(config))
    main(["-q", "build", str(folder), "--out-dir", str(tmp_path / "built"), "--precision", "fp32"])  # 4: no TensorRT
    out = tmp_path / "built" / folder.name
    sidecar = json.loads((out / "pipeline.json").read_text())
    assert sidecar["generation"]["eos_token_id"] == expected_any[3]
    pipeline = load_pipeline(out, backend="ort")
    assert pipeline.config["num_key_value_heads"] == spec.kv_heads
    capsys.readouterr()
    assert main(["-q", "run", str(out), "--backend", "ort", "--generate", "8", "--prompt", ",".join(map(str, PROMPT)),
                 "--json"]) == 0
    tokens = [r["tokens"] for r in json.loads(capsys.readouterr().out)["requests"]]
    assert tokens == [_greedy(spec, PROMPT, 8, eos=expected_any[3])]


def test_window_layers_generate_over_their_window_buffer(tmp_path, capsys):
    """decoder.sliding_window (Gemma 2's sliding layers): their past inputs are window buffers of window_size slots
    from the first step on (an empty one is refused by GroupQueryAttention: "KV cache capacity (0) must be at least
    local_window_size"); a prompt longer than the window."""
    spec = GenaiSpec(window=4, sliding=(0,))
    folder = write_genai_folder(tmp_path / "m", spec)
    config = read_genai_config(folder)
    assert (config.window_size, config.window_layers) == (4, (0,))
    assert config.window_buffers() == {"past_key_values.0.key": 4, "past_key_values.0.value": 4}
    assert read_genai_config(write_genai_folder(tmp_path / "plain", GenaiSpec())).window_buffers() == {}
    prompt = [5, 6, 7, 8, 9, 10]
    expected = _greedy(spec, prompt, 8, eos=-1)
    assert main(["-q", "run", str(folder), "--generate", "8", "--prompt", ",".join(map(str, prompt)), "--json",
                 "--eos", "-1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in out["requests"]] == [expected], out


def test_sliding_window_is_read_from_the_decoder_and_ignores_what_is_not_a_window():
    """One reader of decoder.sliding_window for the runtime and for folder_genai's rewrite of the config."""
    from trtattn.folder_genai import window_layers
    from trtattn.runtime.genai_config import sliding_window

    config = {"model": {"decoder": {"sliding_window": {"window_size": 8, "layers": [0, "x", 2]}}}}
    assert sliding_window(config) == (8, (0, 2))
    assert window_layers(config) == (8, [0, 2])
    for empty in ({}, {"model": {"decoder": {"sliding_window": None}}},
                  {"model": {"decoder": {"sliding_window": {"window_size": 0, "layers": [1]}}}}):
        assert window_layers(empty) == (0, [])
    assert sliding_window({"model": {"decoder": {}}}) == (None, ())
