"""Greedy generation through an export folder's parts, as Hugging Face Optimum lays them out.

    decoder-only      model.onnx (with past; empty past on the first step), or decoder_model.onnx +
                      decoder_with_past_model.onnx, or decoder_model_merged.onnx (If on use_cache_branch)
    encoder-decoder   encoder_model.onnx + decoder_model.onnx + decoder_with_past_model.onnx, or
                      encoder_model.onnx + decoder_model_merged.onnx

I/O by Optimum's names: input_ids, attention_mask, position_ids, encoder_hidden_states,
encoder_attention_mask, use_cache_branch, past_key_values.* -> logits, present.*. A part's `present.X`
becomes the next step's `past_key_values.X`; an empty present (the merged decoder's cache branch gives
empty cross-attention K/V, by design) keeps the value it had. A folder of engines written by
`trtattn build DIR` carries a pipeline.json naming the parts (routes read by `load_pipeline`). There the
decoder with past is the kv-cache form: the first decoder step (padded form) runs as above, then its
presents seed the form's static cache and its cross-attention K/V are set once (runtime.generate).

A folder ONNX Runtime GenAI's builder wrote has genai_config.json (runtime/genai_config.py): its decoder file,
heads and head size, context length and special tokens are read from it.

Generation settings come from generation_config.json (else config.json, else genai_config.json): eos_token_id, pad_token_id,
decoder_start_token_id, max_length. Greedy = argmax of the last position's logits, one request at a time
(a batch of 1, as a request with no padding: what Optimum's generate does for one prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..contract import PIPELINE_JSON
from ..errors import TrtattnError
from .cache import cache_dims
from .genai_config import read_genai_config

PAST, PRESENT = "past_key_values.", "present."
# part role -> Optimum's file stems, in the order they are preferred
PART_FILES = {
    "encoder": ("encoder_model",),
    "decoder": ("decoder_model_merged", "decoder_model", "model"),
    "decoder_with_past": ("decoder_with_past_model",),
}
SETTINGS = ("eos_token_id", "pad_token_id", "decoder_start_token_id", "bos_token_id", "max_length")


@dataclass
class Pipeline:
    """An export folder's parts (role -> path) and its generation settings."""
    folder: Path
    parts: dict[str, Path]
    settings: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    forms: dict = field(default_factory=dict)  # role -> form, for a folder of engines (pipeline.json)

    @property
    def kind(self) -> str:
        return "encoder-decoder" if "encoder" in self.parts else "decoder-only"

    @property
    def merged(self) -> bool:
        return self.parts["decoder"].stem.startswith("decoder_model_merged")

    def eos_ids(self) -> set[int]:
        eos = self.settings.get("eos_token_id")
        return set(eos if isinstance(eos, list) else [eos]) - {None}


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TrtattnError(f"{path}: not readable JSON ({e})") from None


def generation_settings(folder: Path) -> dict:
    """eos/pad/decoder start/max length: generation_config.json over config.json, as transformers reads them,
    and over genai_config.json (a folder ONNX Runtime GenAI's builder wrote has only that one)."""
    config = _read_json(folder / "config.json")
    gen = _read_json(folder / "generation_config.json")
    genai = read_genai_config(folder)
    settings = {k: gen.get(k, config.get(k)) for k in SETTINGS if gen.get(k, config.get(k)) is not None}
    return settings if genai is None else {**genai.settings(), **settings}


def find_parts(folder: Path, suffix: str = ".onnx") -> dict[str, Path]:
    parts = {}
    for role, stems in PART_FILES.items():
        for stem in stems:
            if (folder / f"{stem}{suffix}").exists():
                parts[role] = folder / f"{stem}{suffix}"
                break
    if "decoder" in parts and parts["decoder"].stem.startswith("decoder_model_merged"):
        parts.pop("decoder_with_past", None)  # the merged decoder is both
    return parts


def load_pipeline(folder, backend: str = "auto") -> Pipeline:
    """The parts of an export folder, or of a folder `trtattn build DIR` wrote (pipeline.json): its engines,
    or with backend="ort" the verified form models they were built from."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TrtattnError(f"{folder}: not a folder")
    sidecar = folder / PIPELINE_JSON
    if sidecar.exists():
        meta = _read_json(sidecar)
        key = "onnx" if backend == "ort" else "file"
        entries = meta.get("parts", {})
        failed = [f"{role}: {p['error']}" for role, p in entries.items() if p.get("error")]
        if failed:
            raise TrtattnError(f"{sidecar}: parts were not prepared ({'; '.join(failed)})")
        parts = {role: folder / p[key] for role, p in entries.items()} if key == "onnx" or not meta.get(
            "tensor_parallel") else _rank_parts(sidecar, meta)
        missing = [str(p) for p in parts.values() if not p.exists()]
        if missing:
            raise TrtattnError(f"{sidecar} names parts that are not there: {', '.join(missing)}"
                               + (" (built without TensorRT: --backend ort runs the verified forms)" if key == "file" else ""))
        return Pipeline(folder, parts, meta.get("generation", {}), _model_config(folder),
                        {role: p.get("form") for role, p in entries.items()})
    parts, genai = find_parts(folder), read_genai_config(folder)
    if genai is not None and genai.filename and (folder / genai.filename).is_file() and "encoder" not in parts:
        parts["decoder"] = folder / genai.filename  # the decoder GenAI's config names
    if "decoder" not in parts:
        raise TrtattnError(f"{folder}: no decoder to generate with (expected model.onnx, decoder_model.onnx or "
                           f"decoder_model_merged.onnx, as Optimum writes them, or genai_config.json's decoder)")
    return Pipeline(folder, parts, generation_settings(folder), _model_config(folder))


WINDOW_BUFFERS = "trtattn_window_buffers"  # a config key of no library: past input -> its window buffer's slots


def _model_config(folder: Path) -> dict:
    """config.json, with what ONNX Runtime GenAI's config says of the model beside it (heads, head size, and under
    WINDOW_BUFFERS the past inputs that are fixed window buffers)."""
    config, genai = _read_json(folder / "config.json"), read_genai_config(folder)
    if genai is None:
        return config
    windows = genai.window_buffers()
    return {**config, **genai.as_hf_config(), **({WINDOW_BUFFERS: windows} if windows else {})}


def _rank_parts(sidecar: Path, meta: dict) -> dict[str, Path]:
    """A tensor-parallel pipeline (build DIR --tp N): this rank process's engine of each part."""
    from .ranks import this_rank

    n, me = meta["tensor_parallel"], this_rank()
    if me is None:
        raise TrtattnError(f"{sidecar}: each part is a set of {n} rank engines: `trtattn run {sidecar.parent} "
                           f"--generate N` runs them on {n} GPUs (or --backend ort its verified forms)")
    if me[1] != n:
        raise TrtattnError(f"{sidecar}: a set of {n} ranks, but this process was launched as rank {me[0]} of {me[1]}")
    return {role: sidecar.parent / p["ranks"][me[0]] for role, p in meta["parts"].items()}


# ---------------------------------------------------------------- one decoder step
def _empty_past(session, name: str, batch: int, config: dict, unread: bool = False) -> np.ndarray:
    """A past of length 0, [batch, kv heads, 0, head size]: heads and head size from the input's static
    dims, else from config.json (or genai_config.json: load_pipeline). unread (a merged decoder's first step,
    whose branch does not read the past): a static length is kept, as the input's shape demands (cross-attention
    K/V over a fixed encoder length). A window buffer (WINDOW_BUFFERS: GenAI's sliding layers) has its slots from
    the first step on, zeros holding no key, as GenAI gives it."""
    info = session.input(name)
    heads, size = cache_dims(session, name, config)
    length = info.shape[2] if unread and isinstance(info.shape[2], int) and info.shape[2] >= 0 else 0
    length = (config.get(WINDOW_BUFFERS) or {}).get(name, length)
    return np.zeros((batch, heads, length, size), info.dtype)


def _step(session, ids: np.ndarray, past: dict, length: int, extra: dict, config: dict) -> tuple[np.ndarray, dict]:
    """Run one decoder part on `ids` after `length` cached tokens: the last position's logits and the
    presents as the next step's past (an empty present keeps the past it replaces)."""
    batch, new = ids.shape
    feeds = {"input_ids": ids, **extra}
    names = session.input_names
    if "attention_mask" in names:
        feeds["attention_mask"] = np.ones((batch, length + new), np.int64)
    if "decoder_attention_mask" in names:
        feeds["decoder_attention_mask"] = np.ones((batch, length + new), np.int64)
    if "position_ids" in names:
        feeds["position_ids"] = np.broadcast_to(np.arange(length, length + new, dtype=np.int64), ids.shape).copy()
    if "cache_position" in names:
        feeds["cache_position"] = np.arange(length, length + new, dtype=np.int64)
    if "use_cache_branch" in names:
        feeds["use_cache_branch"] = np.asarray([length > 0])
    for name in names:
        if name.startswith(PAST):
            feeds[name] = past[name] if name in past else _empty_past(
                session, name, batch, config, unread="use_cache_branch" in names and not length)
    out = session.run(feeds)
    if "logits" not in out:
        raise TrtattnError(f"{session.name}: no 'logits' output; generation needs a model with a language-model head")
    presents = dict(past)
    for name, value in out.items():
        if name.startswith(PRESENT):
            key = PAST + name[len(PRESENT):]
            if value.size or key not in past:
                presents[key] = value
    return out["logits"][:, -1], presents


def generate_pipeline(pipeline: Pipeline, sessions: dict, prompts, max_new_tokens: int, *,
                      encoder_inputs: list[dict] | None = None, eos_token_id=None) -> list[list[int]]:
    """Greedy tokens for each prompt: decoder-only, the prompt's continuation; encoder-decoder, the prompt
    (token ids, or `encoder_inputs`: one feed dict per request, e.g. input_features) is the encoder's input
    and decoding starts from decoder_start_token_id. `sessions`: role -> open session."""
    if max_new_tokens < 1:
        raise TrtattnError("max_new_tokens must be at least 1")
    eos = set([eos_token_id] if eos_token_id is not None else pipeline.eos_ids())
    if pipeline.forms.get("decoder") == "kv-cache":  # one model prefills and decodes
        return _kv_cache_form(pipeline, sessions, prompts, max_new_tokens, eos)
    requests = encoder_inputs if encoder_inputs is not None else prompts
    return [_one(pipeline, sessions, request, max_new_tokens, eos, encoder_inputs is not None)
            for request in requests]


def _one(pipeline: Pipeline, sessions: dict, request, n: int, eos: set, is_feeds: bool) -> list[int]:
    config = pipeline.config
    first, later = sessions["decoder"], sessions.get("decoder_with_past", sessions["decoder"])
    extra = {}
    if pipeline.kind == "encoder-decoder":
        encoder = sessions["encoder"]
        if is_feeds:
            feeds = {k: np.asarray(v) for k, v in request.items()}
        else:
            ids = np.asarray([request], np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        states = encoder.run(feeds)
        hidden = states.get("last_hidden_state", next(iter(states.values())))
        extra["encoder_hidden_states"] = hidden
        extra["encoder_attention_mask"] = feeds.get("attention_mask", np.ones(hidden.shape[:2], np.int64))
        start = pipeline.settings.get("decoder_start_token_id", pipeline.settings.get("bos_token_id"))
        if start is None:
            raise TrtattnError(f"{pipeline.folder}: no decoder_start_token_id in generation_config.json or config.json")
        ids = np.asarray([[start]], np.int64)
    else:
        ids = np.asarray([request], np.int64)
    if pipeline.forms.get("decoder_with_past") == "kv-cache":
        return _then_kv_cache_form(first, later, ids, extra, config, n, eos)
    tokens: list[int] = []
    past: dict[str, np.ndarray] = {}
    length = 0
    session = first
    for _ in range(n):
        logits, past = _step(session, ids, past, length, extra, config)
        length += ids.shape[1]
        token = int(logits[0].argmax())
        tokens.append(token)
        if token in eos:
            break
        ids = np.asarray([[token]], np.int64)
        session = later
    return tokens


def generate_folder(folder, prompts, max_new_tokens: int, *, backend: str = "ort", **kwargs) -> list[list[int]]:
    """Open the parts of an export folder (ONNX Runtime by default) and generate greedily (generate_pipeline)."""
    from .backends import open_session

    pipeline = load_pipeline(folder, backend=backend)  # a built folder's verified forms on "ort"
    sessions = {role: open_session(str(path), backend=backend) for role, path in pipeline.parts.items()}
    try:
        return generate_pipeline(pipeline, sessions, prompts, max_new_tokens, **kwargs)
    finally:
        for s in sessions.values():
            s.close()


def _then_kv_cache_form(first, step, ids: np.ndarray, extra: dict, config: dict, n: int, eos: set) -> list[int]:
    """The first decoder part (padded form, no past) runs on the start tokens; its presents seed the kv-cache
    form's static self-attention cache and its cross-attention K/V (present.*.encoder.*, which the kv-cache
    step takes as plain inputs) and the encoder's padding mask are set once as that step's state;
    runtime.generate decodes from there."""
    from .generate import continue_decoding

    logits, presents = _step(first, ids, {}, 0, extra, config)
    return continue_decoding(step, presents, logits, [ids.shape[1]], n, eos_token_id=eos, record_logits=False,
                             source=first.name, fixed=extra).tokens[0]


def _kv_cache_form(pipeline: Pipeline, sessions: dict, prompts, n: int, eos: set) -> list[list[int]]:
    """A decoder-only pipeline whose one decoder is the kv-cache form: runtime.generate's static cache (prefill
    and decode with the one step model), one request at a time like the rest of this module."""
    from .generate import generate

    if pipeline.kind != "decoder-only":
        raise TrtattnError(f"{pipeline.folder}: an encoder-decoder pipeline whose first decoder step is the kv-cache "
                           "form; `trtattn build DIR` builds it as the padded form (decoder_model.onnx)")
    if len(eos) > 1:
        raise TrtattnError(f"{pipeline.folder}: several eos ids {sorted(eos)}; give one with --eos")
    stop = next(iter(eos), None)
    return [generate(sessions["decoder"], [p], n, eos_token_id=stop, record_logits=False,
                     config=pipeline.config).tokens[0] for p in prompts]


# ---------------------------------------------------------------- text in, text out
def tokenizer_of(folder: Path):
    """The folder's tokenizer.json through the `tokenizers` package, or None when there is none."""
    path = Path(folder) / "tokenizer.json"
    if not path.exists():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TrtattnError("--text needs the `tokenizers` package (pip install tokenizers)") from None
    return Tokenizer.from_file(str(path))
