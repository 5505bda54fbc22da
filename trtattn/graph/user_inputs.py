"""Inputs a user gives for verification (`--inputs FILE`): an .npz of arrays keyed by input name (one input
set), or Polygraphy's inputs JSON, as `polygraphy run --save-inputs` writes it (a list of input sets, read
by Polygraphy's own loader for `--load-inputs`), or a folder of such JSON files, one input set each.

Verification then uses exactly these sets. Each is checked against the model's inputs first; anything
that does not fit (a missing or extra input, a wrong rank, a static dim or element type that differs) is
one line naming the input and the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import TrtattnError
from .roles import input_specs


@dataclass
class InputsUsed:
    """Which inputs a verification ran on: a user's file, or the domains searched for each input."""

    source: str  # "file" or "searched"
    path: str | None = None
    iterations: int = 0
    domains: dict[str, str] = field(default_factory=dict)  # input -> the domain its values were drawn from
    notes: list[str] = field(default_factory=list)  # e.g. random ops and how they were made repeatable

    def to_json(self) -> dict:
        out: dict = {"source": self.source, "iterations": self.iterations}
        if self.path:
            out["path"] = self.path
        if self.domains:
            out["domains"] = self.domains
        if self.notes:
            out["notes"] = self.notes
        return out


def load_inputs(path: str | Path, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """The input sets in `path` (.npz: one set; Polygraphy JSON or a folder of it: one set per entry),
    checked against `model`'s inputs."""
    path = Path(path)
    if not path.exists():
        raise TrtattnError(f"--inputs {path}: no such file")
    sets = _read_npz(path) if path.suffix == ".npz" else _read_polygraphy(path)
    if not sets:
        raise TrtattnError(f"--inputs {path}: holds no input sets")
    sets = [_as_typed(feeds, model) for feeds in sets]
    for k, feeds in enumerate(sets):
        check_feeds(feeds, model, f"--inputs {path}" + (f" (set {k})" if len(sets) > 1 else ""))
    return sets


def _read_npz(path: Path) -> list[dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return [{k: data[k] for k in data.files}]
    except Exception as e:  # numpy's zip and format errors have no common base
        raise TrtattnError(f"--inputs {path}: not a readable .npz of arrays ({type(e).__name__}: {e})") from None


def _read_polygraphy(path: Path) -> list[dict[str, np.ndarray]]:
    from polygraphy.comparator import StreamingDataLoader
    from polygraphy.exception import PolygraphyException

    try:
        sets = [dict(feeds) for feeds in StreamingDataLoader(str(path))]
    except (PolygraphyException, ValueError, TypeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrtattnError(f"--inputs {path}: not Polygraphy's inputs JSON nor an .npz ({first})") from None
    for feeds in sets:
        if not all(isinstance(v, np.ndarray) for v in feeds.values()):
            raise TrtattnError(f"--inputs {path}: an input set holds values that are not arrays")
    return sets


def _as_typed(feeds: dict[str, np.ndarray], model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Arrays of a type numpy has not (bf16, fp8: ml_dtypes), which .npz and Polygraphy's JSON store as raw bytes
    (numpy reads them back as void, "|V2"), taken as the type the model's input has: the same bits."""
    specs = {s.name: s for s in input_specs(model)}
    out = dict(feeds)
    for name, value in feeds.items():
        spec = specs.get(name)
        if spec is not None and value.dtype.kind == "V" and value.dtype.itemsize == np.dtype(spec.dtype).itemsize \
                and np.dtype(spec.dtype).kind == "V" and value.dtype.fields is None:
            out[name] = value.view(spec.dtype)
    return out


def check_feeds(feeds: dict, model: onnx.ModelProto, where: str) -> None:
    """One line naming the first input of `feeds` that does not fit the model's inputs."""
    specs = {s.name: s for s in input_specs(model)}
    extra = [k for k in feeds if k not in specs]
    if extra:
        raise TrtattnError(f"{where}: '{extra[0]}' is not an input of the model (inputs: {', '.join(specs)})")
    missing = [k for k in specs if k not in feeds]
    if missing:
        raise TrtattnError(f"{where}: no value for the model's input '{missing[0]}'")
    for name, spec in specs.items():
        value = np.asarray(feeds[name])
        if value.dtype != spec.dtype:
            raise TrtattnError(f"{where}: input '{name}' is {value.dtype}, the model takes {spec.dtype}")
        if value.ndim != len(spec.shape):
            raise TrtattnError(f"{where}: input '{name}' has shape {list(value.shape)}, the model takes rank "
                               f"{len(spec.shape)} ({_shown(spec.shape)})")
        wrong = [axis for axis, d in enumerate(spec.shape) if isinstance(d, int) and value.shape[axis] != d]
        if wrong:
            raise TrtattnError(f"{where}: input '{name}' has shape {list(value.shape)}, the model takes "
                               f"{_shown(spec.shape)} (axis {wrong[0]})")


def _shown(shape: list) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass
class GivenInputs:
    """A user's input sets (load_inputs) and the file they came from."""

    path: str
    sets: list[dict[str, np.ndarray]]

    @classmethod
    def load(cls, path: str | Path | None, model: onnx.ModelProto) -> GivenInputs | None:
        return None if path is None else cls(str(path), load_inputs(path, model))

    def widened(self, model: onnx.ModelProto) -> GivenInputs:
        """These sets for `model`, the one they were given for widened to fp32 (rewrite/precision/widen.py): each
        bf16 or fp16 array the model now takes in fp32 converted to it, exactly."""
        low = {np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t)) for t in (TensorProto.BFLOAT16, TensorProto.FLOAT16)}
        specs = {s.name: np.dtype(s.dtype) for s in input_specs(model)}
        sets = [{k: (v.astype(np.float32) if specs.get(k) == np.float32 and v.dtype in low else v)
                 for k, v in feeds.items()} for feeds in self.sets]
        for k, feeds in enumerate(sets):
            check_feeds(feeds, model, f"--inputs {self.path}" + (f" (set {k})" if len(sets) > 1 else ""))
        return GivenInputs(self.path, sets)

    def used(self) -> InputsUsed:
        return InputsUsed("file", self.path, len(self.sets))

    def dims(self, model: onnx.ModelProto) -> dict[str, int]:
        """The model's dim names -> their sizes in the first input set: the dims these inputs fix (a name
        written as an expression of others, "past+seq", fixes nothing of its own)."""
        covered: dict[str, int] = {}
        for spec in input_specs(model):
            value = np.asarray(self.sets[0][spec.name])
            for axis, d in enumerate(spec.shape):
                if isinstance(d, str) and (d.isidentifier() or d.endswith("]")):
                    covered.setdefault(d, int(value.shape[axis]))
        return covered
