"""Safe loading and saving of ONNX models, and the one atomic file writer.

- Loading checks the file before protobuf sees it, so every bad input gives one clear sentence.
- External data must live next to the model (no absolute paths, no `..` escapes).
- `load(path, load_external_data=False)` leaves the weights on disk (graph/external.py): the model
  stays small whatever its size, and every trtattn step reads the weights from their files.
- Saving is atomic (temporary files + rename) and refuses to write over the input model or its data.
- A model whose weights are on disk, or which is over 2 GB, is saved with one external data file
  PATH.data, written by copying byte ranges file to file.
- Every file trtattn writes (models, reports, engines, sidecars) goes through atomic_write.
- Temporary files and scratch folders carry the writer's pid in their names (`.NAME.trtattn-PID-...`,
  `trtattn-PID-...`): a run killed before it could clean up leaves them, and the next run that writes
  beside them (or opens a scratch folder) removes those whose process is gone.
- A failed write (full disk, file-size limit, a parent that is a file) is one line naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from ..errors import ModelLoadError, TrtattnError
from ..timings import timed
from . import external, validate
from .external import all_tensors, data_dir, materialize  # noqa: F401  (part of this module's API)

PROTOBUF_LIMIT = 2**31 - 1
_OURS = re.compile(r"(?:^\..*\.|^)trtattn-(\d+)-")  # temporary names trtattn gives: pid after "trtattn-"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.trtattn-{os.getpid()}-"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files and scratch folders trtattn left in `folder` from runs that were killed
    (their pid is in the name and no longer runs); returns what it removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _OURS.match(entry.name)
        if not m or int(m.group(1)) == os.getpid() or alive(int(m.group(1))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)  # hard links inside: only the links go, never the user's files
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


@contextlib.contextmanager
def scratch_dir(kind: str = ""):
    """A temporary folder for the duration, named with this process's pid: stale ones of dead runs go first."""
    remove_stale(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix=f"trtattn-{os.getpid()}-{kind + '-' if kind else ''}") as folder:
        yield folder


@contextlib.contextmanager
def writing(path: str | os.PathLike):
    """Any OSError while writing `path` as one line naming it: a full disk (ENOSPC, or EFBIG from a file-size
    limit) says so. Folders made for `path` are removed again when the write fails."""
    missing = [p for p in Path(path).absolute().parents if not p.exists()]
    try:
        yield
    except BaseException as e:
        for folder in missing:  # innermost first; a folder something else wrote into stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not isinstance(e, OSError):
            raise
        if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise TrtattnError(f"no space left writing {path} ({e.strerror})") from None
        raise TrtattnError(f"cannot write {path}: {e.strerror or e}") from None


def check_target(path: str | os.PathLike) -> None:
    """An output path must be a file whose nearest existing ancestor is a folder."""
    path = Path(path)
    if path.is_dir():
        raise TrtattnError(f"cannot write {path}: it is a directory")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise TrtattnError(f"cannot write {path}: {parent} is not a directory")
            break


def _make_parent(path: Path) -> None:
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path.parent)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename: a reader never
    sees a half-written file and a failure leaves the old one. New files get the usual mode (umask)."""
    path = Path(path)
    with writing(path):
        _make_parent(path)
        with _staged(path) as tmp:
            Path(tmp).write_bytes(data.encode() if isinstance(data, str) else data)
    return path


@contextlib.contextmanager
def _staged(path: Path):
    """A pid-named temporary file beside `path` (a killed run's is removed by the next: remove_stale),
    renamed onto `path` with the usual mode when the block succeeds, removed when it fails."""
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def refuse_overwrite(path, protect=(), force: bool = True) -> None:
    """Never write over an input (`protect`); replace an existing output only when forced; a path that
    cannot be a file (a directory, under a file) is refused."""
    check_target(path)
    for p in protect:
        if p is not None and same_file(p, path):
            raise TrtattnError(f"refusing to write over the input {p}; choose another output path")
    if not force and Path(path).exists():
        raise TrtattnError(f"{path} exists; pass --force to replace it")


def _external_locations(model: onnx.ModelProto):
    for tensor in all_tensors(model):
        if uses_external_data(tensor):
            yield tensor.name, ExternalDataInfo(tensor)


@timed("read")
def load(path: str | os.PathLike, load_external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX model, raising ModelLoadError with one sentence on any problem. With
    load_external_data=False the weights stay in their files (external.py): tensors up to
    external.INLINE_LIMIT bytes are read, the rest are read by whatever needs them, from the folder
    the model records."""
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
        why = str(e).splitlines()[0] if str(e) else "cannot parse"
        raise ModelLoadError(f"{path}: not a valid ONNX model ({type(e).__name__}: {why})") from None
    if not model.graph.node and not model.graph.input and not model.graph.output:
        raise ModelLoadError(f"{path}: not a valid ONNX model (no graph)")
    external.set_data_dir(model, None)  # a folder recorded by someone else means nothing here
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
            raise ModelLoadError(f"{path}: external data file '{info.location}' is truncated "
                                 f"(tensor '{name}' needs {needed} bytes)")
    try:
        if load_external_data:
            onnx.load_external_data_for_model(model, str(base))
            _strip_external(model)  # the data is in the proto now: nothing may look for the files again
        elif any(uses_external_data(t) for t in all_tensors(model)):
            external.set_data_dir(model, base)  # also when every tensor is small: its outputs keep external data
            external.read_small(model, base)
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot read external data ({e})") from None
    return model


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


@timed("write")
def save(model: onnx.ModelProto, path: str | os.PathLike, *, protect: tuple = (), external_data: bool | None = None,
         check: bool = True, progress=None) -> Path:
    """Write `model` atomically. Never writes over any path in `protect` (the inputs) or over a data file
    the model reads. With external data (the default for a model whose weights are on disk, and past
    2 GB) every tensor over 1 KB goes to PATH.data, written before the model that names it; weights on
    disk are copied file to file. The model is left as it was. `check`: refuse a model less valid than the
    ONNX models in `protect` it was made from, or one ONNX Runtime does not load (graph/validate.py), rather
    than write it. `progress` (report.Progress) counts the tensors of the data file."""
    path = Path(path)
    refuse_overwrite(path, protect)
    if check:
        check_written(model, f"not writing {path}, the model made for it is invalid", protect)
    if data_dir(model) is None:
        lost = next((t.name for t in all_tensors(model) if uses_external_data(t)), None)
        if lost is not None:  # written as it is, the output would name data files that are not beside it
            raise TrtattnError(f"cannot write {path}: tensor '{lost}' has its data in an external file, but the model "
                               f"does not say which folder that is in (load it with trtattn.graph.io.load, and keep "
                               f"its metadata on models made from it)")
    if external_data is None:
        external_data = data_dir(model) is not None or is_large(model)
    if not external_data:
        with _materialized_copy_if_needed(model) as whole:
            return atomic_write(path, whole.SerializeToString())
    data_name = path.name + ".data"
    data_path = path.parent / data_name
    for src in external.source_files(model) | {Path(str(p) + ".data") for p in protect if p is not None}:
        if same_file(src, data_path):
            raise TrtattnError(f"refusing to write {data_path}: the input's weights are in it; choose another output path")
    with writing(path):
        _make_parent(path)
        # both files in a scratch folder beside the target, renamed at the end (the data first): a kill
        # leaves no output or a complete one, and the scratch folder for the next run to remove
        with tempfile.TemporaryDirectory(prefix=_temp_prefix(path), dir=path.parent) as scratch:
            with external.externalized(model, scratch, data_name, progress=progress):
                with open(os.path.join(scratch, path.name), "wb") as f:
                    f.write(model.SerializeToString())
            _publish(scratch, path, data_name)
    return path


def _publish(scratch: str, path: Path, data_name: str) -> None:
    """A model and its data file written in `scratch` renamed beside `path`, the data first."""
    for name in (data_name, path.name):
        os.chmod(os.path.join(scratch, name), 0o666 & ~_umask())
        os.replace(os.path.join(scratch, name), path.parent / name)


def save_made(path: str | os.PathLike, make, *, protect: tuple = (), check: bool = True) -> onnx.ModelProto:
    """Write the model `make(data)` returns while it is made, for a model larger than memory: `data`
    (external.DataWriter) is PATH.data, which `data.tensor(name, array)` writes a weight to at once; the
    weights the model still reads from elsewhere are then copied file to file. Atomic, refused and checked
    as save is. The model comes back as written, its weights left in PATH.data."""
    path = Path(path)
    refuse_overwrite(path, protect)
    data_name = path.name + ".data"
    with writing(path):
        _make_parent(path)
        with tempfile.TemporaryDirectory(prefix=_temp_prefix(path), dir=path.parent) as scratch:
            with external.DataWriter(scratch, data_name) as data:
                model = make(data)
                read = external.source_files(model) | {Path(str(p) + ".data") for p in protect if p is not None}
                if any(same_file(src, path.parent / data_name) for src in read):
                    raise TrtattnError(f"refusing to write {path.parent / data_name}: the input's weights are in "
                                       "it; choose another output path")
                data.take(model)
            if check:
                check_written(model, f"not writing {path}, the model made for it is invalid", protect)
            external.set_data_dir(model, None)  # the file names its data beside it
            with open(os.path.join(scratch, path.name), "wb") as f:
                f.write(model.SerializeToString())
            _publish(scratch, path, data_name)
    external.set_data_dir(model, path.parent)
    return model


@timed("check written")
def check_written(model: onnx.ModelProto, what: str, sources=()) -> None:
    """validate.check_written of `model`, made from the ONNX files among `sources` (read as trtattn reads
    them, weights left on disk), loaded in ONNX Runtime as it would be written when a check is excused."""
    found = validate.findings(model)
    if not found:
        return
    read = [load(p, load_external_data=False) for p in sources if p is not None and Path(p).is_file()
            and Path(p).suffix == ".onnx"]
    with session_source(model) as source:
        validate.check_written(model, what, read, source, found=found)


@timed("reload")
def default_session_refusal(model: onnx.ModelProto) -> str | None:
    """None when ONNX Runtime with default session options (as a user loads what trtattn writes) builds a
    session for `model` (the bytes it would be written as, its weights where they are), else its reason."""
    with session_source(model) as source:
        return validate.onnx_runtime_refusal(source, data_dir(model))


@contextlib.contextmanager
def _materialized_copy_if_needed(model: onnx.ModelProto):
    """The model with all its data in the proto: itself, or a copy whose weights were read in."""
    if data_dir(model) is None:
        yield model
        return
    whole = onnx.ModelProto()
    whole.CopyFrom(model)
    yield materialize(whole)


@timed("write")
def copy_model(src: str | os.PathLike, dst: str | os.PathLike, model: onnx.ModelProto) -> Path:
    """The output of a command that changed nothing: the input itself (byte for byte, or with its external data
    in one file beside it): `model`, as read from `src`, is checked as any output is (check_written), so a model
    that fails a check the file fails too is copied when ONNX Runtime loads it."""
    if data_dir(model) is not None or any(uses_external_data(t) for t in all_tensors(model)) or is_large(model):
        return save(model, dst, protect=(src,))
    refuse_overwrite(dst, (src,))
    check_written(model, f"not writing {dst}, the model is invalid", (src,))
    dst = Path(dst)
    with writing(dst):
        _make_parent(dst)
        with _staged(dst) as tmp:
            shutil.copyfile(src, tmp)
    return dst


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor data held in the proto (what pushes a model past protobuf's 2 GB), from dims and
    types: cheap, unlike ByteSize(), which walks the whole model (14 s on a 2 GB one)."""
    return sum(external.nbytes(t) for t in all_tensors(model) if not uses_external_data(t))


def weights_size(model: onnx.ModelProto) -> int:
    """Bytes of all the model's weights, in the proto or on disk."""
    return weight_bytes(model) + external.external_bytes(model)


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
    """What an ONNX Runtime session, Polygraphy's SessionFromOnnx or TensorRT's parser can open: the
    serialized model, or a path in a temporary folder. A model whose weights are on disk gets hard links
    to its data files there (or, across file systems, a copy); a model over 2 GB is written with
    external data. The model is left as it was."""
    folder = data_dir(model)
    if folder is None and not is_large(model):
        yield model.SerializeToString()
        return
    with scratch_dir("session") as scratch:  # hard links to the user's weights: gone even after a kill (next run)
        path = os.path.join(scratch, "model.onnx")
        if folder is not None and not is_large(model) and _link_data(model, folder, Path(scratch)):
            with open(path, "wb") as f:
                f.write(model.SerializeToString())
        else:
            save(model, path, external_data=True, check=False)  # a scratch copy: its owner checks what it writes
        yield path


def _link_data(model: onnx.ModelProto, folder: Path, scratch: Path) -> bool:
    """Hard links in `scratch` to every data file the model reads; False if the file system refuses."""
    try:
        for location in {ExternalDataInfo(t).location for t in all_tensors(model) if uses_external_data(t)}:
            link = scratch / location
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(folder / location, link)
        return True
    except OSError:
        return False


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
            t.ClearField("data_location")  # unset, as the model had it: its bytes come back unchanged
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
