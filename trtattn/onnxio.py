"""Safe loading and saving of ONNX models.

- Loading checks the file before protobuf sees it, so every bad input gives one clear sentence.
- External data must live next to the model (no absolute paths, no `..` escapes).
- Saving is atomic (temporary file + rename) and refuses to write over the input model.
- Models over 2 GB are saved with external data automatically.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from .errors import ModelLoadError, TrtattnError

_PROTOBUF_LIMIT = 2**31 - 1


def _external_locations(model: onnx.ModelProto):
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if uses_external_data(tensor):
            yield tensor.name, ExternalDataInfo(tensor)


def load(path: str | os.PathLike, load_external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX model, raising ModelLoadError with one sentence on any problem."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path}: file is empty")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends
        raise ModelLoadError(f"{path}: not a valid ONNX model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'cannot parse'})") from None
    if not model.graph.node and not model.graph.input and not model.graph.output:
        raise ModelLoadError(f"{path}: not a valid ONNX model (no graph)")
    base = path.parent.resolve()
    for name, info in _external_locations(model):
        location = Path(info.location)
        target = (base / location).resolve()
        if location.is_absolute() or base not in target.parents:
            raise ModelLoadError(f"{path}: external data of tensor '{name}' points outside the model's folder ({info.location})")
        if not target.exists():
            raise ModelLoadError(f"{path}: external data file '{info.location}' of tensor '{name}' is missing")
        needed = (info.offset or 0) + (info.length or 0)
        if info.length and target.stat().st_size < needed:
            raise ModelLoadError(f"{path}: external data file '{info.location}' is truncated (tensor '{name}' needs {needed} bytes)")
    if load_external_data:
        try:
            onnx.load_external_data_for_model(model, str(base))
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot read external data ({e})") from None
    return model


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def save(model: onnx.ModelProto, path: str | os.PathLike, *, protect: tuple = (), external_data: bool | None = None) -> Path:
    """Write `model` atomically. Never writes over any path in `protect` (the inputs)."""
    path = Path(path)
    for p in protect:
        if p is not None and same_file(p, path):
            raise TrtattnError(f"refusing to write over the input model {p}; choose another output path")
    path.parent.mkdir(parents=True, exist_ok=True)
    if external_data is None:
        external_data = model.ByteSize() > _PROTOBUF_LIMIT if _safe_size(model) else True
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if external_data:
            data_name = path.name + ".data"
            tmp_data = path.parent / (Path(tmp).name + ".data")
            onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=tmp_data.name, size_threshold=1024)
            # The model refers to its data file by name: rewrite the reference to the final name.
            saved = onnx.load(tmp, load_external_data=False)
            for tensor in onnx.external_data_helper._get_all_tensors(saved):
                for entry in tensor.external_data:
                    if entry.key == "location":
                        entry.value = data_name
            onnx.save_model(saved, tmp)
            os.replace(tmp_data, path.parent / data_name)
        else:
            onnx.save_model(model, tmp)
        os.replace(tmp, path)
    except BaseException:
        for leftover in (tmp, str(Path(tmp)) + ".data"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        raise
    return path


def _safe_size(model: onnx.ModelProto) -> bool:
    """ByteSize() itself fails beyond 2 GB on some protobuf builds: tell whether it is usable."""
    try:
        model.ByteSize()
        return True
    except Exception:
        return False
