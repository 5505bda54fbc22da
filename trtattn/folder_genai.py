"""ONNX Runtime GenAI folders (the model builder's output): genai_config.json made to match the models written.

GenAI reads genai_config.json to drive its models: which file is the decoder, the names of the past and present
caches, and `search.past_present_share_buffer`. With that option on, GenAI binds one buffer of the context
length as both past and present, which only a present written into the past's buffer can fill: com.microsoft
GroupQueryAttention's, and the standard ONNX Attention op's converted from it with `shared_buffer`
(rewrite/group_query.py: attends over the buffer's valid slots and gathers Concat(past, new) back into the buffer's
layout). The decoders such a config names (`shared_decoders`) are fused that way, so their presents are written
in place wherever the original's are, and the config is kept. A present the original writes by any other op (a
Concat: the standard op's present by its definition, longer than the past by the new tokens) cannot share the
buffer: the option is turned off, and the folder's result says so. Everything else in the config is kept as
written.

The layers decoder.sliding_window names (Gemma 2/3) keep a fixed window buffer (GroupQueryAttention's
sliding_window_cache); fused, they read and write the buffer's slots as the kernel does (rewrite/window_cache.py),
which is no concatenation: they share a buffer as GroupQueryAttention did (GenAI gives them window_size +
cache_slack slots, 16 on CPU when 0, or max_length). Without a shared buffer GenAI gives such a layer an empty
first past, which GroupQueryAttention refuses as well (the capacity must reach the window): when the option is
off (as the config came, or for a concatenated present's sake), the folder is written with a note saying GenAI
cannot run it (`window_note`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import TrtattnError
from .runtime.genai_config import sliding_window

CONFIG = "genai_config.json"
SHARE_BUFFER = "past_present_share_buffer"
# the op that writes its present into the past's buffer (GenAI's shared buffer); every other writes a new tensor
IN_PLACE_WRITERS = {("com.microsoft", "GroupQueryAttention")}


@dataclass(frozen=True)
class ConfigChange:
    """One setting of genai_config.json changed, and why."""
    key: str  # dotted path in the JSON, e.g. search.past_present_share_buffer
    old: object
    new: object
    reason: str

    def note(self) -> str:
        return f"{CONFIG}: {self.key} {json.dumps(self.old)} -> {json.dumps(self.new)}: {self.reason}"


def is_genai_config(path: Path) -> bool:
    return path.name == CONFIG


def read_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TrtattnError(f"{path}: not a readable {CONFIG} ({e})") from e
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise TrtattnError(f"{path}: a {CONFIG} without a 'model' section")
    return config


def decoder_files(config: dict) -> list[str]:
    """The model files the config's decoder names, relative to the config's folder: decoder.filename, or each
    part of a decoder pipeline."""
    decoder = config["model"].get("decoder") or {}
    files = [decoder["filename"]] if isinstance(decoder.get("filename"), str) else []
    for part in decoder.get("pipeline") or []:  # [{"name": {"filename": ...}}, ...]
        files += [p["filename"] for p in part.values() if isinstance(p, dict) and isinstance(p.get("filename"), str)]
    return files


def present_patterns(config: dict) -> list[str]:
    """The decoder's present output names as patterns with %d for the layer (GenAI's defaults where unsaid)."""
    outputs = (config["model"].get("decoder") or {}).get("outputs") or {}
    keys = ("present_key_names", "present_value_names")
    defaults = {"present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    return [outputs.get(k, defaults[k]) for k in keys]


def window_layers(config: dict) -> tuple[int, list[int]]:
    """(window_size, layers) of the config's decoder.sliding_window; (0, []) when it names no layers."""
    size, layers = sliding_window(config)
    return (size, list(layers)) if size and layers else (0, [])


def _window_presents(config: dict) -> set[str]:
    return {p.replace("%d", str(n)) for n in window_layers(config)[1] for p in present_patterns(config)}


def _is_present(name: str, patterns: list[str]) -> bool:
    return any(re.fullmatch(re.escape(p).replace("%d", r"\d+"), name) for p in patterns)


def shared_decoders(path: Path) -> list[Path]:
    """The decoder files the genai_config.json at `path` names when its past and present share a buffer (each to
    be fused with `shared_buffer`), else none."""
    config = read_config(path)
    if (config.get("search") or {}).get(SHARE_BUFFER) is not True:
        return []
    return [path.parent / name for name in decoder_files(config)]


def presents_not_in_place(model_path: Path, patterns: list[str]) -> list[str]:
    """The present outputs of a model that an op other than GroupQueryAttention writes (each `name <- op`)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    writer = {out: node for node in graph.node for out in node.output}
    found = []
    for output in graph.output:
        if not _is_present(output.name, patterns):
            continue
        node = writer.get(output.name)
        op = (node.domain or "", node.op_type) if node is not None else ("", "graph input")
        if op not in IN_PLACE_WRITERS:
            found.append(f"{output.name} <- {op[0] + ':' if op[0] else ''}{op[1]}")
    return found


def adapt_config(source: Path, written: Path, rewritten: set[str]) -> list[ConfigChange]:
    """SOURCE's genai_config.json made to match the models written beside WRITTEN (the folder's models in
    `rewritten`, relative to the config's folder, are the ones changed): written there when a setting changes
    (nothing written otherwise). Returns the changes."""
    config = read_config(source)
    changes = []
    search = config.get("search")
    if isinstance(search, dict) and search.get(SHARE_BUFFER) is True:
        why = _why_not_shared(config, source.parent, rewritten)
        if why:
            search[SHARE_BUFFER] = False
            changes.append(ConfigChange(f"search.{SHARE_BUFFER}", True, False, why))
    if changes:
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(json.dumps(config, indent=4) + "\n")
    return changes


def _why_not_shared(config: dict, folder: Path, rewritten: set[str]) -> str | None:
    """Why the rewritten decoders cannot share the buffer, read from the originals in `folder`: each
    GroupQueryAttention was converted to write into the buffer (shared_decoders), every other writer stays a
    concatenation."""
    patterns = present_patterns(config)
    for name in decoder_files(config):
        if name not in rewritten:
            continue  # written as read: shares the buffer as it did
        path = folder / name
        if not path.is_file():
            raise TrtattnError(f"{CONFIG} names the decoder {name}, which the folder does not have")
        concatenated = presents_not_in_place(path, patterns)
        if concatenated:
            shown = ", ".join(concatenated[:2]) + (f" (and {len(concatenated) - 2} more)" if len(concatenated) > 2 else "")
            return (f"{name} writes presents by ops other than GroupQueryAttention, which the fused model writes as "
                    f"Concat(past, new), longer than the past by the "
                    f"new tokens ({shown}), so past and present cannot share one buffer; GenAI passes the cache grown instead")
    return None


def window_note(source: Path, written: Path, rewritten: set[str]) -> str | None:
    """Why GenAI cannot run the fused decoders beside WRITTEN with the config written there (else SOURCE's), when
    their window layers (decoder.sliding_window) are fused and past and present share no buffer (see the module
    doc); None otherwise."""
    config = read_config(written if written.is_file() else source)
    if (config.get("search") or {}).get(SHARE_BUFFER) is True:
        return None
    size, layers = window_layers(config)
    windows = _window_presents(config)
    folder = written.parent
    fused = [p for name in decoder_files(config) if name in rewritten and (folder / name).is_file()
             for p in presents_not_in_place(folder / name, present_patterns(config))
             if p.split(" <- ")[0] in windows]
    if not fused:
        return None
    return (f"{CONFIG}: the sliding_window layers {layers} are fused with their window buffer of at least {size} "
            f"slots ({', '.join(fused[:2])}): ONNX Runtime GenAI cannot run them without "
            f"search.{SHARE_BUFFER} (it gives such a layer an empty first past, which GroupQueryAttention refuses "
            f"too); `trtattn run DIR --generate` feeds them their buffer")
