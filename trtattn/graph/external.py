"""Weights that stay on disk.

`io.load(path, load_external_data=False)` keeps every external tensor larger than INLINE_LIMIT in its
data file and records, in the model's metadata (DIR_KEY), the folder those files live in. Such a
model is small whatever its weights: analysis, rewrites and graph copies never hold the weights.
Whoever needs them gets them from here:

- `mapped(tensor, folder)`: a read-only memory map of one tensor (pages are read only when touched);
- `set_session_folder(options, model)`: tell ONNX Runtime, opening a model from bytes, the folder of its weights;
- `externalized(model, folder, data_name)`: the model with every weight in one new data file, written
  by copying byte ranges file to file (never through Python memory), then put back as it was;
- `materialize(model)`: every weight read into the proto (for tools that must have them in memory);
- `DataWriter(folder, data_name)`: a data file written weight by weight while a model is made (io.save_made).
"""

from __future__ import annotations

import contextlib
import os
from math import prod
from pathlib import Path

import numpy as np
import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from ..errors import TrtattnError

DIR_KEY = "trtattn.external_data_dir"
INLINE_LIMIT = 64 << 10  # external tensors this small (shape constants, scalars, norms) are read at load
ALIGN = 4096  # offsets in data files trtattn writes: ONNX Runtime memory-maps page-aligned tensors
INLINE_THRESHOLD = 1024  # tensors over this many bytes go to the data file when a model is written with one
_COPY_CHUNK = 64 << 20
# element types numpy cannot address one element per item (packed 4-bit): read through onnx instead
_PACKED = {getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
           if hasattr(onnx.TensorProto, n)}


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


FOLDER_OPTION = "session.model_external_initializers_file_folder_path"


def set_session_folder(options, model: onnx.ModelProto | None) -> None:
    """ONNX Runtime session `options` for `model` opened from bytes: where its weights left on disk are.
    From bytes ONNX Runtime resolves external data against the working directory, which is not the model's
    folder when trtattn runs from elsewhere (a model or a piece of one, e.g. a probed cone, that records
    its folder: data_dir)."""
    folder = data_dir(model) if model is not None else None
    if folder is not None:
        options.add_session_config_entry(FOLDER_OPTION, str(folder))


def data_dir(model: onnx.ModelProto) -> Path | None:
    """The folder a lazily loaded model's external data lives in (None: all weights are in the proto)."""
    for p in model.metadata_props:
        if p.key == DIR_KEY:
            return Path(p.value)
    return None


def set_data_dir(model: onnx.ModelProto, folder: str | os.PathLike | None) -> None:
    keep = [p for p in model.metadata_props if p.key != DIR_KEY]
    if len(keep) != len(model.metadata_props):
        del model.metadata_props[:]
        model.metadata_props.extend(keep)
    if folder is not None:
        model.metadata_props.add(key=DIR_KEY, value=str(Path(folder).resolve()))


def nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a tensor's data from its dims and type, without touching the data."""
    if uses_external_data(tensor):
        length = ExternalDataInfo(tensor).length
        if length:
            return int(length)
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    size = prod(tensor.dims) * itemsize
    return (size + 1) // 2 if tensor.data_type in _PACKED else size


def external_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the weights left on disk."""
    return sum(nbytes(t) for t in all_tensors(model) if uses_external_data(t))


def read_small(model: onnx.ModelProto, folder: Path, limit: int = INLINE_LIMIT) -> None:
    """Read external tensors of at most `limit` bytes into the proto: the matcher and shape inference
    read shape constants and scalars, whichever way the exporter stored them."""
    for t in all_tensors(model):
        if uses_external_data(t) and nbytes(t) <= limit:
            onnx.external_data_helper.load_external_data_for_tensor(t, str(folder))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]


def mapped(tensor: onnx.TensorProto, folder: str | os.PathLike) -> np.ndarray:
    """A tensor's external data as a read-only array backed by its file: nothing is read until used."""
    info = ExternalDataInfo(tensor)
    path = Path(folder) / info.location
    shape = tuple(int(d) for d in tensor.dims)
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    size = prod(shape)
    if dtype is None or tensor.data_type in _PACKED or size == 0 or (info.length and info.length != size * dtype.itemsize):
        return onnx.numpy_helper.to_array(tensor, base_dir=str(folder))
    array = np.memmap(path, dtype=dtype, mode="r", offset=int(info.offset or 0), shape=(size,))
    return array.reshape(shape)


def own_mapping(array: np.ndarray) -> np.ndarray:
    """`array`, an array `mapped` gave, read through a mapping of its own that goes with the result: pages
    read through it leave the process when it is dropped, though the weight's first mapping lives on (one
    weight at a time in memory while a whole model's weights are read). Any other array as it is."""
    base: object = array
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):  # np.asarray(a memmap): a view of it
        base = base.base
    if (not isinstance(base, np.memmap) or base.filename is None or not array.flags.c_contiguous
            or base.size != array.size
            or base.__array_interface__["data"][0] != array.__array_interface__["data"][0]):
        return array
    return np.memmap(base.filename, dtype=array.dtype, mode="r", offset=base.offset, shape=array.shape)


def source_files(model: onnx.ModelProto) -> set[Path]:
    """The data files a lazily loaded model's external tensors are in."""
    folder = data_dir(model)
    if folder is None:
        return set()
    return {(folder / ExternalDataInfo(t).location).resolve() for t in all_tensors(model) if uses_external_data(t)}


def materialize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Read every external tensor into the proto (in place) and forget where it came from."""
    folder = data_dir(model)
    if folder is not None:
        onnx.load_external_data_for_model(model, str(folder))
        for t in all_tensors(model):
            if uses_external_data(t) and t.HasField("raw_data"):
                t.data_location = onnx.TensorProto.DEFAULT
                del t.external_data[:]
        set_data_dir(model, None)
    return model


class _DataFile:
    """One data file written front to back, every tensor at an ALIGN-ed offset; a byte range of another
    file is copied by the kernel (copy_file_range: no user-space buffer; a reflink where the file system
    has them), with read/write in chunks as the fallback."""

    def __init__(self, f):
        self.f = f
        self.end = 0
        self.copied: dict[tuple, int] = {}

    def _start(self) -> int:
        start = -(-self.end // ALIGN) * ALIGN
        if start > self.end:
            os.pwrite(self.f.fileno(), b"\0" * (start - self.end), self.end)
        return start

    def write(self, data: bytes | memoryview) -> int:
        start = self._start()
        os.pwrite(self.f.fileno(), data, start)
        self.end = start + len(data)
        return start

    def copy(self, src: Path, offset: int, length: int) -> int:
        key = (str(src), offset, length)
        if key in self.copied:  # the same bytes named by two tensors: one copy
            return self.copied[key]
        start = self._start()
        with open(src, "rb") as s:
            done = 0
            while done < length:
                n = _copy_range(s.fileno(), self.f.fileno(), length - done, offset + done, start + done)
                if n <= 0:
                    raise TrtattnError(f"{src}: external data ends before byte {offset + length} (truncated?)")
                done += n
        self.end = start + length
        self.copied[key] = start
        return start


def _copy_range(src: int, dst: int, count: int, src_at: int, dst_at: int) -> int:
    try:
        return os.copy_file_range(src, dst, min(count, 1 << 30), src_at, dst_at)
    except (AttributeError, OSError):
        data = os.pread(src, min(count, _COPY_CHUNK), src_at)
        return os.pwrite(dst, data, dst_at) if data else 0


@contextlib.contextmanager
def externalized(model: onnx.ModelProto, folder: str | os.PathLike, data_name: str,
                 threshold: int = INLINE_THRESHOLD, progress=None):
    """The model with every tensor over `threshold` bytes in folder/data_name (weights left on disk are
    copied file to file, weights in the proto are written out), for as long as the context lasts; then
    the model is as it was (tensors that were in the proto are read back from the new file). `progress`
    (report.Progress) counts the tensors written."""
    source = data_dir(model)
    target = Path(folder) / data_name
    moved: list[tuple] = []  # (tensor, its old external entries or None if it was in the proto, offset, length)
    try:
        with open(target, "wb") as f:
            out = _DataFile(f)
            tensors = [t for t in all_tensors(model)
                       if uses_external_data(t) or (t.HasField("raw_data") and nbytes(t) > threshold)]
            counted = progress.count(tensors, f"writing {data_name}", unit="tensor") if progress is not None else tensors
            for t in counted:
                old = [(e.key, e.value) for e in t.external_data] if uses_external_data(t) else None
                at, length = _move(t, out, source, data_name)
                moved.append((t, old, at, length))
        with _without_data_dir(model):
            yield target
    finally:
        for t, old, at, length in moved:
            if old is None:  # it was in the proto: read it back
                _point(t, data_name, at, length)
                onnx.external_data_helper.load_external_data_for_tensor(t, str(folder))
                t.data_location = onnx.TensorProto.DEFAULT
                del t.external_data[:]
            else:
                del t.external_data[:]
                for k, v in old:
                    t.external_data.add(key=k, value=v)


def _move(t: onnx.TensorProto, out: _DataFile, source: Path | None, data_name: str) -> tuple[int, int]:
    """Put tensor `t`'s bytes in `out` (copied file to file from `source` when left on disk, else written
    from the proto) and point `t` at them; (offset, length)."""
    if uses_external_data(t):
        info = ExternalDataInfo(t)
        if source is None:
            raise TrtattnError(f"tensor '{t.name}' has its data in '{info.location}', but the model does "
                               "not say which folder that is in (load it with trtattn.graph.io.load)")
        src = source / info.location
        length = int(info.length or (src.stat().st_size - int(info.offset or 0)))
        at = out.copy(src, int(info.offset or 0), length)
    else:
        at, length = out.write(t.raw_data), nbytes(t)
        t.ClearField("raw_data")
    _point(t, data_name, at, length)
    return at, length


class DataWriter:
    """A model's data file written while the model is made, for a model larger than memory: `tensor(name,
    array)` writes one weight now and gives the TensorProto naming its bytes (the array can go at once);
    `take(model)` then moves every other weight of the model in (those left on disk copied file to file,
    those over the threshold in the proto written out) and makes the model read them all from here."""

    def __init__(self, folder: str | os.PathLike, data_name: str, threshold: int = INLINE_THRESHOLD):
        self.folder, self.data_name, self.threshold = Path(folder), data_name, threshold
        self._file = open(self.folder / data_name, "wb")
        self._out = _DataFile(self._file)
        self._mine: set[str] = set()  # tensors written by tensor(): already here

    def tensor(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        array = np.ascontiguousarray(array)
        proto = onnx.TensorProto(name=name, dims=array.shape,
                                 data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
        at = self._out.write(array.reshape(-1).view(np.uint8).data)
        _point(proto, self.data_name, at, array.nbytes)
        self._mine.add(name)
        return proto

    def take(self, model: onnx.ModelProto) -> None:
        source = data_dir(model)
        for t in all_tensors(model):
            if uses_external_data(t) and t.name in self._mine and ExternalDataInfo(t).location == self.data_name:
                continue
            if uses_external_data(t) or (t.HasField("raw_data") and nbytes(t) > self.threshold):
                _move(t, self._out, source, self.data_name)
        set_data_dir(model, self.folder)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> DataWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _point(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del t.external_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=k, value=v)


@contextlib.contextmanager
def _without_data_dir(model: onnx.ModelProto):
    folder = data_dir(model)
    set_data_dir(model, None)
    try:
        yield model
    finally:
        if folder is not None:
            set_data_dir(model, folder)
