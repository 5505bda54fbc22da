"""Hugging Face Optimum as the real client of export folders (issue 21, issue 18 class 6).

Run in the Optimum venv (README): `.venv-optimum/bin/python -m pytest -m optimum`. Elsewhere these tests
skip: optimum-onnx pins an older transformers than the zoo's. Models are random-weight transformers
configs saved to a temporary folder and exported from there with optimum's main_export (no downloads);
the tokenizer is a WordLevel one built with the `tokenizers` package."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

pytest.importorskip("optimum.onnxruntime", reason="needs Hugging Face Optimum (optimum-onnx): run in .venv-optimum "
                                                   "(README: the Optimum environment)")
pytestmark = pytest.mark.optimum

from trtattn.cli import main  # noqa: E402
from trtattn.rewrite.fuse import fuse_model  # noqa: E402
from trtattn.runtime import OrtSession  # noqa: E402
from trtattn.runtime.pipeline import generate_pipeline, load_pipeline  # noqa: E402

VOCAB = 64
WORDS = [f"w{i}" for i in range(VOCAB - 4)]
PROMPT = [5, 9, 17, 3, 22]


def _tokenizer(folder):
    """A WordLevel tokenizer over VOCAB ids: [PAD]=0, [BOS]=1, [EOS]=2, [UNK]=3, then w0, w1, ..."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins tokens with spaces
    tok.save(str(folder / "tokenizer.json"))


def _export(kind: str, root):
    import torch
    import transformers
    from optimum.exporters.onnx import main_export

    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model, task = transformers.LlamaForCausalLM(cfg), "text-generation-with-past"
    elif kind == "t5":
        cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                    num_heads=4, decoder_start_token_id=0, eos_token_id=2, pad_token_id=0)
        model, task = transformers.T5ForConditionalGeneration(cfg), "text2text-generation-with-past"
    elif kind == "bart":
        cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                      decoder_ffn_dim=64, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0, decoder_start_token_id=2, forced_eos_token_id=None)
        model, task = transformers.BartForConditionalGeneration(cfg), "text2text-generation-with-past"
    elif kind == "whisper":
        cfg = transformers.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=1500,  # 3000 frames
                                         max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                         decoder_start_token_id=1, begin_suppress_tokens=None, suppress_tokens=None)
        model, task = transformers.WhisperForConditionalGeneration(cfg), "automatic-speech-recognition-with-past"
    else:
        raise ValueError(kind)
    src, out = root / f"{kind}-src", root / kind
    model.eval().save_pretrained(src)
    _tokenizer(src)
    main_export(str(src), str(out), task=task, no_post_process=False, do_validation=False)
    _tokenizer(out)
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimum")
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = _export(kind, root)
        return made[kind]

    return get


def _ort_model(kind, folder):
    from optimum.onnxruntime import ORTModelForCausalLM, ORTModelForSeq2SeqLM

    cls = ORTModelForCausalLM if kind == "llama" else ORTModelForSeq2SeqLM
    return cls.from_pretrained(str(folder))


def _optimum_tokens(kind, folder, n):
    import torch

    model = _ort_model(kind, folder)
    ids = torch.tensor([PROMPT])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         num_beams=1)[0].tolist()
    return out[len(PROMPT):] if kind == "llama" else out[1:]  # after the prompt / the decoder start token


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_fused_folder_loads_in_optimum_and_generates_the_same_tokens(exports, kind, tmp_path):
    folder = exports(kind)
    out = tmp_path / "fused"
    assert main(["fuse", str(folder), "-o", str(out), "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] and report["sites"] and all(s["status"] == "fused" for s in report["sites"])
    models = {f["file"]: f for f in report["files"] if f["action"] != "copied"}
    assert all(f["action"] == "fused" for f in models.values())
    for name in models:
        assert any(n.op_type == "Attention" for n in _all_nodes(onnx.load(str(out / name))))
    want = _optimum_tokens(kind, folder, 8)
    assert len(want) >= 2
    assert _optimum_tokens(kind, out, 8) == want


def _all_nodes(model):
    def walk(g):
        for n in g.node:
            yield n
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from walk(a.g)
    return list(walk(model.graph))


@pytest.mark.parametrize("kind", ["llama", "t5", "bart"])
def test_run_folder_generate_equals_optimum_generate(exports, kind, capsys):
    folder = exports(kind)
    want = _optimum_tokens(kind, folder, 8)
    pipeline = load_pipeline(folder)
    sessions = {role: OrtSession(str(path)) for role, path in pipeline.parts.items()}
    assert generate_pipeline(pipeline, sessions, [PROMPT], 8) == [want]
    capsys.readouterr()
    assert main(["run", str(folder), "--generate", "8", "--prompt", ",".join(map(str, PROMPT)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"][0]["tokens"] == want


def test_run_folder_text_in_text_out(exports, capsys):
    folder = exports("llama")
    text = " ".join(WORDS[i - 4] for i in PROMPT if i >= 4)
    capsys.readouterr()
    assert main(["run", str(folder), "--generate", "4", "--text", text, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["requests"][0]
    from tokenizers import Tokenizer

    assert row["text"] == Tokenizer.from_file(str(folder / "tokenizer.json")).decode(row["tokens"])
    assert row["text"].strip()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["t5", "bart", "whisper"])
def test_merged_decoder_fuses_every_site_of_both_branches(exports, kind):
    """Class 6: the with-cache branch returns empty cross-attention presents by design; each branch is
    verified on its own (use_cache_branch forced each way) and every site of both is fused."""
    path = exports(kind) / "decoder_model_merged.onnx"
    original = onnx.load(str(path))
    result = fuse_model(original)
    branches = result.verification.branches
    assert set(branches) == {"use_cache_branch=False", "use_cache_branch=True"}
    assert all(b.passed for b in branches.values()) and result.ok
    names = [r.site.name for r in result.reports]
    assert sum(n.startswith("use_cache_branch=False") for n in names) == 4  # self + cross, 2 layers
    assert sum(n.startswith("use_cache_branch=True") for n in names) == 4
    assert all(r.status == "fused" for r in result.reports)
    onnx.checker.check_model(result.model)
    # the fused merged model runs both ways like the original, empty presents included
    a, b = OrtSession(original, name="original"), OrtSession(result.model, name="fused")
    assert [i.name for i in a.inputs] == [i.name for i in b.inputs]
    assert [o.name for o in a.outputs] == [o.name for o in b.outputs]
    for use_cache in (False, True):
        feeds = _merged_feeds(a, use_cache)
        want, got = a.run(feeds), b.run(feeds)
        assert want.keys() == got.keys()
        for name in want:
            assert want[name].shape == got[name].shape, name
            assert np.abs(want[name] - got[name]).max(initial=0) <= 1e-4, name


def _merged_feeds(session, use_cache: bool) -> dict:
    """Feeds of a merged seq2seq decoder: a first step (no past) or a step after 3 cached tokens."""
    rng = np.random.default_rng(0)
    past, enc, new = (3 if use_cache else 0), 5, (1 if use_cache else 4)
    feeds = {"use_cache_branch": np.asarray([use_cache])}
    for i in session.inputs:
        if i.name == "use_cache_branch":
            continue
        if i.name in ("input_ids", "decoder_input_ids"):
            feeds[i.name] = rng.integers(4, VOCAB, (1, new)).astype(np.int64)
        elif "attention_mask" in i.name:
            feeds[i.name] = np.ones((1, enc), np.int64)
        elif i.name == "encoder_hidden_states":
            feeds[i.name] = rng.standard_normal((1, enc, 32)).astype(np.float32)
        elif i.name.startswith("past_key_values."):
            heads, size = i.shape[1], i.shape[3]
            length = enc if ".encoder." in i.name else past
            feeds[i.name] = rng.standard_normal((1, heads, length, size)).astype(np.float32)
        else:
            raise AssertionError(f"unexpected input {i.name}")
    return feeds
