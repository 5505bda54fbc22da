"""genai_config.json, which ONNX Runtime GenAI's model builder writes beside its models: the decoder's file, heads,
key/value heads, head size, hidden size and layers, the context length, the special tokens and whether past and
present share one buffer, and which layers keep a fixed window buffer (decoder.sliding_window: Gemma 2/3's sliding
layers, whose GroupQueryAttention reads past_key_values as window_size slots). Read here once, typed, for the
commands that need what it says: `run DIR --generate` (the cache's heads and head size where the model's dims are
symbolic, the stop tokens, the window buffers' slots), `build` (the context length as the
cache capacity) and the dims search (the head size where the ops and weights do not tell it: graph/op_dims.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import TrtattnError

GENAI_CONFIG = "genai_config.json"


@dataclass(frozen=True)
class GenaiConfig:
    path: Path
    filename: str | None = None  # the decoder's model file, in the config's folder
    heads: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    hidden: int | None = None
    layers: int | None = None
    context_length: int | None = None
    max_length: int | None = None  # search.max_length
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    share_buffer: bool = False  # search.past_present_share_buffer
    window_size: int | None = None  # decoder.sliding_window.window_size
    window_layers: tuple[int, ...] = ()  # decoder.sliding_window.layers: the layers keeping a window buffer
    past_names: tuple[str, ...] = ("past_key_values.%d.key", "past_key_values.%d.value")  # decoder.inputs'

    def window_buffers(self) -> dict[str, int]:
        """The past inputs that are window buffers -> their slots (window_size), from decoder.sliding_window."""
        if not self.window_size:
            return {}
        return {p.replace("%d", str(n)): self.window_size for n in self.window_layers for p in self.past_names}

    def as_hf_config(self) -> dict:
        """What it says under config.json's names (num_key_value_heads, head_dim, ...), the ones it has."""
        named = {"num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_size,
                 "hidden_size": self.hidden, "num_hidden_layers": self.layers,
                 "max_position_embeddings": self.context_length}
        return {k: v for k, v in named.items() if v is not None}

    def settings(self) -> dict:
        """Generation settings as runtime/pipeline.py reads them (eos/pad/bos, max_length)."""
        named = {"eos_token_id": self.eos_token_id, "pad_token_id": self.pad_token_id,
                 "bos_token_id": self.bos_token_id, "max_length": self.max_length or self.context_length}
        return {k: v for k, v in named.items() if v is not None}


def _int(value) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def sliding_window(data: dict) -> tuple[int | None, tuple[int, ...]]:
    """(window_size, layers) of a genai_config's decoder.sliding_window; (None, ()) where it says none."""
    model = data.get("model", {}) if isinstance(data, dict) else {}
    decoder = model.get("decoder", {}) if isinstance(model, dict) else {}
    window = decoder.get("sliding_window") if isinstance(decoder, dict) else None
    if not isinstance(window, dict):
        return None, ()
    return _int(window.get("window_size")), tuple(n for n in window.get("layers") or [] if isinstance(n, int))


def read_genai_config(where: str | Path | None) -> GenaiConfig | None:
    """The genai_config.json of a folder, or beside a model file; None when there is none. One line naming the file
    when it is not JSON."""
    if not where:
        return None
    where = Path(where)
    path = where / GENAI_CONFIG if where.is_dir() else where.parent / GENAI_CONFIG
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TrtattnError(f"{path}: not readable JSON ({e})") from None
    model = data.get("model", {}) if isinstance(data, dict) else {}
    decoder, search = model.get("decoder", {}) or {}, data.get("search", {}) or {}
    eos = model.get("eos_token_id")
    window_size, window_layers = sliding_window(data)
    names = decoder.get("inputs")
    names = names if isinstance(names, dict) else {}
    pasts = tuple(names.get(k, d) for k, d in (("past_key_names", "past_key_values.%d.key"),
                                                ("past_value_names", "past_key_values.%d.value")))
    return GenaiConfig(
        path, filename=decoder.get("filename") if isinstance(decoder.get("filename"), str) else None,
        heads=_int(decoder.get("num_attention_heads")), kv_heads=_int(decoder.get("num_key_value_heads")),
        head_size=_int(decoder.get("head_size")), hidden=_int(decoder.get("hidden_size")),
        layers=_int(decoder.get("num_hidden_layers")), context_length=_int(model.get("context_length")),
        max_length=_int(search.get("max_length")), bos_token_id=model.get("bos_token_id"),
        eos_token_id=eos if isinstance(eos, (int, list)) else None, pad_token_id=model.get("pad_token_id"),
        share_buffer=bool(search.get("past_present_share_buffer", False)), window_size=window_size,
        window_layers=window_layers,
        past_names=tuple(p for p in pasts if isinstance(p, str)))
