"""Calibration data: a dict (or an .npz file) of arrays keyed by model input name, in ModelOpt's
convention: the samples concatenated along axis 0 (the batch axis), so N samples of a model with a
dynamic batch are N calibration steps of batch 1 (a static batch b takes N / b steps)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from ...errors import TrtattnError
from ...graph.shapes import dims_of


class CalibrationError(TrtattnError):
    """The calibration data does not fit the model."""


def load_calibration(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Arrays of an .npz file, keyed by name (no pickles)."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"{path}: no such calibration file")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as e:
        raise _unreadable(path, e) from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise CalibrationError(f"{path}: a single array (.npy), not an .npz of arrays keyed by model input name")
    try:
        return {k: data[k] for k in data.files}
    except Exception as e:
        raise _unreadable(path, e) from None
    finally:
        data.close()


def _unreadable(path: Path, e: Exception) -> CalibrationError:
    first = str(e).splitlines()[0] if str(e) else "cannot read"
    return CalibrationError(f"{path}: not a readable .npz file ({type(e).__name__}: {first})")


def stack_feeds(feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Feed dicts (e.g. trtattn.graph.feeds.make_feeds with several seeds) -> ModelOpt's calibration dict."""
    return {k: np.concatenate([f[k] for f in feeds], axis=0) for k in feeds[0]}


def check_calibration(model: onnx.ModelProto, calib: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The calibration arrays, checked against the model's inputs and cast to their dtypes.

    Raises CalibrationError (one sentence) when keys, ranks, static dims, dtypes or sample counts
    do not fit."""
    if not isinstance(calib, dict) or not calib:
        raise CalibrationError("calibration data must be a non-empty dict of arrays keyed by model input name")
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    names = [i.name for i in inputs]
    missing = [n for n in names if n not in calib]
    extra = [k for k in calib if k not in names]
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
            ([f"unknown {', '.join(map(str, extra))}"] if extra else [])
        raise CalibrationError(f"calibration data keys do not match the model inputs ({'; '.join(parts)}); "
                               f"expected exactly: {', '.join(names)}")
    out, counts = {}, {}
    for vi in inputs:
        out[vi.name] = arr = _checked(vi, np.asarray(calib[vi.name]))
        counts[vi.name] = arr.shape[0] // (_static_batch(vi) or 1)
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise CalibrationError(f"calibration arrays hold different numbers of samples along axis 0 ({detail}); "
                               "each must hold its samples concatenated along axis 0 (ModelOpt's convention)")
    return out


def _checked(vi: onnx.ValueInfoProto, arr: np.ndarray) -> np.ndarray:
    """One input's array: rank, static dims (beyond the batch), dtype and a sample count that fits."""
    name, dims = vi.name, dims_of(vi)
    want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    shape = "x".join(map(str, arr.shape)) or "scalar"
    model_shape = "x".join("?" if d is None else str(d) for d in dims or [])
    if dims is not None and arr.ndim != len(dims):
        raise CalibrationError(f"calibration array '{name}' has rank {arr.ndim} ({shape}); "
                               f"the model input has rank {len(dims)} ({model_shape})")
    for axis, d in enumerate(dims or []):
        if axis and isinstance(d, int) and arr.shape[axis] != d:
            raise CalibrationError(f"calibration array '{name}' has shape {shape}; "
                                   f"the model input is {model_shape} (axis {axis} must be {d})")
    if arr.dtype != want:
        if _kind(arr.dtype) != _kind(want):
            raise CalibrationError(f"calibration array '{name}' is {arr.dtype}; the model input is {want}")
        arr = arr.astype(want)
    if arr.ndim == 0 or arr.shape[0] == 0:
        raise CalibrationError(f"calibration array '{name}' has no samples (shape {shape})")
    batch = _static_batch(vi)
    if batch and arr.shape[0] % batch:
        raise CalibrationError(f"calibration array '{name}' has {arr.shape[0]} rows along axis 0, "
                               f"not a multiple of the model's static batch {batch}")
    return arr


def _static_batch(vi: onnx.ValueInfoProto) -> int | None:
    first = (dims_of(vi) or [None])[0]
    return first if isinstance(first, int) and first else None


def _kind(dt: np.dtype) -> str:
    """What a cast may stay within: signed and unsigned integers are one kind ("b" bool, "f" float)."""
    return "int" if dt.kind in "iu" else dt.kind
