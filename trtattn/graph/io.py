"""Safe loading and saving of ONNX models, and the one atomic file writer.

- Loading checks the file before protobuf sees it, so every bad input gives one clear sentence.
- External data must live next to the model (no absolute paths, no `..` escapes).
- Saving is atomic (temporary file + rename) and refuses to write over the input model.
- Models over 2 GB are saved with external data automatically.
- Every file trtattn writes (models, reports, engines, sidecars) goes through atomic_write.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from ..errors import ModelLoadError, TrtattnError

PROTOBUF_LIMIT = 2**31 - 1


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename: a reader never
    sees a half-written file and a failure leaves the old one. New files get the usual mode (umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def refuse_overwrite(path, protect=(), force: bool = True) -> None:
    """Never write over an input (`protect`); replace an existing output only when forced."""
    for p in protect:
        if p is not None and same_file(p, path):
            raise TrtattnError(f"refusing to write over the input {p}; choose another output path")
    if not force and Path(path).exists():
        raise TrtattnError(f"{path} exists; pass --force to replace it")


def all_tensors(model: onnx.ModelProto):
    """Every TensorProto a model holds: initializers and tensor attributes, subgraphs included."""

    def of_graph(g: onnx.GraphProto):
        yield from g.initializer
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    yield a.t
                elif a.type == onnx.AttributeProto.TENSORS:
                    yield from a.tensors
                elif a.type == onnx.AttributeProto.GRAPH:
                    yield from of_graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        yield from of_graph(sub)

    yield from of_graph(model.graph)


def _external_locations(model: onnx.ModelProto):
    for tensor in all_tensors(model):
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
        _strip_external(model)  # the data is in the proto now: nothing may look for the files again
    return model


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def save(model: onnx.ModelProto, path: str | os.PathLike, *, protect: tuple = (), external_data: bool | None = None) -> Path:
    """Write `model` atomically. Never writes over any path in `protect` (the inputs). With external
    data (automatic past 2 GB) the weights go to PATH.data, written before the model that names it."""
    path = Path(path)
    refuse_overwrite(path, protect)
    if external_data is None:
        external_data = is_large(model)
    if not external_data:
        return atomic_write(path, model.SerializeToString())
    data_name = path.name + ".data"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as scratch:
        tmp = os.path.join(scratch, path.name)
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        # saving moved the weights out of the caller's model: read them back in
        onnx.load_external_data_for_model(model, scratch)
        _strip_external(model)
        for name in (data_name, path.name):
            os.chmod(os.path.join(scratch, name), 0o666 & ~_umask())
            os.replace(os.path.join(scratch, name), path.parent / name)
    return path


def copy_model(src: str | os.PathLike, dst: str | os.PathLike, model: onnx.ModelProto) -> Path:
    """The output of a command that changed nothing: the input itself, with its external data."""
    if any(uses_external_data(t) for t in all_tensors(model)) or is_large(model):
        return save(model, dst, protect=(src,))
    refuse_overwrite(dst, (src,))
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return dst


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of initializer data held in the proto (what pushes a model past protobuf's 2 GB).
    Cheap, unlike ByteSize(), which walks the whole model (14 s on a 2 GB one)."""
    total = 0
    for t in all_tensors(model):
        if not uses_external_data(t):
            total += len(t.raw_data) + 4 * (len(t.float_data) + len(t.int32_data)) + 8 * (
                len(t.int64_data) + len(t.double_data))
    return total


def is_large(model: onnx.ModelProto, margin: int = 64 << 20) -> bool:
    return weight_bytes(model) > PROTOBUF_LIMIT - margin


def _strip_external(model: onnx.ModelProto) -> None:
    """Forget external-data locations after the data was read back into the proto."""
    for t in all_tensors(model):
        if uses_external_data(t) and t.HasField("raw_data"):
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]


@contextlib.contextmanager
def session_source(model: onnx.ModelProto):
    """What an ONNX Runtime session (or Polygraphy's SessionFromOnnx) can open: the serialized
    model, or for a model over 2 GB a temporary file with external data. The model is left as
    it was."""
    if not is_large(model):
        yield model.SerializeToString()
        return
    with tempfile.TemporaryDirectory(prefix="trtattn-") as scratch:
        path = os.path.join(scratch, "model.onnx")
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=1024)
        try:
            yield path
        finally:
            onnx.load_external_data_for_model(model, scratch)
            _strip_external(model)


@contextlib.contextmanager
def weights_aside(model: onnx.ModelProto, threshold: int = 1024):
    """Take the initializer data out of the model for the duration (yields {name: bytes}) and put
    it back after: tools that serialize the whole model (ONNX's version converter and shape
    inference) then work past 2 GB and copy little. A tensor without data keeps its dims and
    type; it is marked as external so nothing takes it for an empty tensor."""
    aside: dict[str, bytes] = {}
    for t in all_tensors(model):
        if t.HasField("raw_data") and len(t.raw_data) > threshold and t.name:
            aside[t.name] = t.raw_data
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            t.external_data.add(key="location", value="trtattn-weights-aside")
    try:
        yield aside
    finally:
        attach_weights(model, aside)


def attach_weights(model: onnx.ModelProto, weights: dict[str, bytes]) -> None:
    """Give tensors set aside by weights_aside (same names) their data back."""
    for t in all_tensors(model):
        if t.name in weights and uses_external_data(t) and not t.HasField("raw_data"):
            t.raw_data = weights[t.name]
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]


@contextlib.contextmanager
def extra_outputs(model: onnx.ModelProto, names):
    """The model with more graph outputs (by name; ONNX Runtime infers their types), in place
    and undone afterwards: copying a proto over 2 GB is impossible."""
    existing = {o.name for o in model.graph.output}
    added = [n for n in dict.fromkeys(names) if n not in existing]
    for n in added:
        model.graph.output.append(onnx.ValueInfoProto(name=n))
    try:
        yield model
    finally:
        for _ in added:
            model.graph.output.pop()
