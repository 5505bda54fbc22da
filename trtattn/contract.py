"""The engine I/O contract shared by the forms, verification and the runtime.

A form model and the engine built from it take these extra inputs; the runtime and the verifier feed
them. This module is a leaf: it imports nothing of trtattn but the errors.

- WRITE_INDEX [B] (int64): where each row's new K/V go in the preallocated caches (kv-cache form).
- CU_SEQLENS [B+1] (int32): cumulative token counts of the sequences packed end to end (packed form);
  cu_seqlens[0] == 0 and cu_seqlens[-1] == total tokens.
- A cache input is one whose sequence axis is the dim named MAX_CACHE (its capacity).
- A form model says which form it is, and which inputs it reads as per-row lengths, in its metadata
  (FORM_METADATA).
- An engine NAME.engine comes with its sidecar NAME.json (the plan, the I/O contract, the aliases).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import TrtattnError

WRITE_INDEX = "cache_write_index"
CU_SEQLENS = "cu_seqlens"
MAX_CACHE = "max_cache"
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
PIPELINE_JSON = "pipeline.json"  # a folder's parts and their engines (build DIR)
FORM_METADATA = "trtattn.form"  # {"form": ..., "right_padded": [inputs read as per-row lengths]}


def is_engine_path(path) -> bool:
    return isinstance(path, (str, Path)) and Path(path).suffix.lower() in ENGINE_SUFFIXES


def cu_seqlens(lengths) -> np.ndarray:
    """Cumulative lengths [B+1] (int32) of rows of these lengths."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int32)


def pack_rows(rows) -> np.ndarray:
    """Rows [S_i, ...] end to end: [1, sum S_i, ...]. The one packer of ragged batches."""
    return np.concatenate([np.asarray(r) for r in rows])[None]


def pack_padded(value: np.ndarray, lengths) -> np.ndarray:
    """A right-padded [B, S, ...] array packed to [1, T, ...], keeping each row's first lengths[b] entries."""
    return pack_rows(value[b, :n] for b, n in enumerate(lengths))


def unpack_rows(value: np.ndarray, cu) -> list[np.ndarray]:
    """[1, T, ...] back into one [S_i, ...] per row of the cumulative lengths."""
    return [value[0, int(cu[b]):int(cu[b + 1])] for b in range(len(cu) - 1)]


def cache_inputs(model) -> list[str]:
    """The inputs of an ONNX model that the kv-cache form reads as preallocated caches."""
    return [i.name for i in model.graph.input if any(d.dim_param == MAX_CACHE for d in i.type.tensor_type.shape.dim)]


def record_form(model, form: str, right_padded: list[str]) -> None:
    """Write (or replace) a form model's FORM_METADATA record."""
    for i, p in enumerate(model.metadata_props):
        if p.key == FORM_METADATA:
            del model.metadata_props[i]
            break
    model.metadata_props.add(key=FORM_METADATA, value=json.dumps({"form": form, "right_padded": right_padded}))


def form_record(model) -> dict:
    """What a form model says about itself (FORM_METADATA), or {} for any other model."""
    for p in model.metadata_props:
        if p.key == FORM_METADATA:
            try:
                return json.loads(p.value)
            except ValueError:
                return {}
    return {}


def sidecar_path(engine_path) -> Path:
    return Path(engine_path).with_suffix(".json")


def load_sidecar(engine_path) -> dict | None:
    """NAME.json next to NAME.engine (trtattn build writes it), or None."""
    path = sidecar_path(engine_path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise TrtattnError(f"{path}: not a valid sidecar JSON ({e})") from None
    return data if isinstance(data, dict) else None
