"""Tiny ONNX Runtime GenAI folders from random-weight checkpoints (no downloads), and greedy tokens from them.

Run in a venv with onnxruntime-genai, torch and transformers (pyproject's `genai` extra, README: the GenAI
environment). `checkpoint` saves a transformers config of the family with random weights and a WordLevel
tokenizer built locally; `build` runs GenAI's model builder on it (`python -m onnxruntime_genai.models.builder
-i CHECKPOINT -o OUT -p PRECISION -e cpu`); `greedy_tokens` generates with og.Model and og.Generator.

    python -m trtattn.testing.genai_builds OUT_ROOT [FAMILY ...] [--precision fp32 int4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

VOCAB = 96  # no Linear of the model is this wide: the builder takes a Linear of the vocab size for the LM head
PROMPT = [5, 9, 17, 3, 22]
# every family: 2 layers, hidden 64, 4 query heads and 2 KV heads of 16, context 128 (block 32 divides the
# matmul widths, as int4's MatMulNBits needs)
_COMMON: dict[str, object] = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False}
FAMILIES: dict[str, tuple[str, dict[str, object]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "phi3": ("Phi3Config", {"original_max_position_embeddings": 128}),
    "granite": ("GraniteConfig", {"attention_multiplier": 0.25, "residual_multiplier": 0.5,
                                  "embedding_multiplier": 2.0, "logits_scaling": 4.0}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 8, "attn_logit_softcapping": 50.0,
                                "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 16}),
    "smollm3": ("SmolLM3Config", {}),
}


def checkpoint(family: str, folder: Path, seed: int = 0) -> Path:
    """A Hugging Face checkpoint folder: the family's tiny config, random weights, a local tokenizer."""
    import torch
    import transformers

    name, extra = FAMILIES[family]
    config = getattr(transformers, name)(**{**_COMMON, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder)
    tokenizer(folder)
    return folder


def tokenizer(folder: Path) -> None:
    """A WordLevel tokenizer over VOCAB ids ([PAD]=0, [BOS]=1, [EOS]=2, [UNK]=3, then w0, w1, ...) saved as
    transformers saves one, so the builder's AutoTokenizer reads it."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, **{f"w{i}": i + 4 for i in range(VOCAB - 4)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]",
                                                pad_token="[PAD]", unk_token="[UNK]")
    fast.save_pretrained(folder)


def build(source: Path, out: Path, precision: str = "fp32", cache: Path | None = None) -> Path:
    """GenAI's model builder on a checkpoint folder, for the CPU."""
    cache = cache or out.parent / f".{out.name}.cache"
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
               "-p", precision, "-e", "cpu", "-c", str(cache)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the model builder failed on {source} ({precision}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return out


def greedy_tokens(folder: Path, prompt=PROMPT, new: int = 10) -> list[int]:
    """The tokens ONNX Runtime GenAI generates greedily from FOLDER after PROMPT (the prompt included): NEW
    of them, the end-of-sequence token held off (min_length) so that every step is compared."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new, min_length=len(prompt) + new)
    generator = og.Generator(model, params)
    generator.append_tokens(list(prompt))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--precision", nargs="+", default=["fp32", "int4"])
    args = parser.parse_args(argv)
    for family in args.families:
        source = checkpoint(family, args.root / "checkpoints" / family)
        for precision in args.precision:
            out = args.root / f"{family}-{precision}"
            try:
                build(source, out, precision)
                print(f"{out}: {greedy_tokens(out)}")
            except Exception as e:  # a family the builder or GenAI refuses is listed, the others still built
                print(f"{out}: FAILED {str(e)[-600:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
