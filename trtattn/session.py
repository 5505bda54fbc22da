"""One inference interface over ONNX Runtime (CPU) and TensorRT engines: the base the back ends
(runtime/ort.py, trt/session.py) implement; runtime/backends.py chooses between them. It sits below both
(it imports nothing of trtattn but its errors), so the TensorRT back end implements it without importing runtime.

    with open_session("engines/llama.engine") as s:      # or an .onnx file / ModelProto (ONNX Runtime)
        out = s.run({"input_ids": ids, ...})              # {output name: numpy array}

Every session describes its I/O (`inputs`, `outputs`: name, dtype, shape with -1 / dim names for
dynamic axes) and its in-place contract: `aliases` maps an output to the input whose buffer it
updates (the kv-cache form's cache outputs; an engine's IKVCacheUpdateLayer outputs). For an
engine that contract comes from the engine itself (ICudaEngine.get_aliased_input_tensor) and its
sidecar JSON (NAME.json next to NAME.engine, written by `trtattn build`); for an ONNX model from
its graph (a TensorScatter writing a graph input into a graph output).

State: inputs a session keeps between runs (KV caches, cross-attention K/V). `set_state(name, a)`
uploads once (to the device for TensorRT); a run then needs no feed for it. After a run
- an output aliased to a state input has updated it in place (TensorRT: the same device buffer is
  bound to both; ONNX Runtime: the returned array replaces the state);
- `carry={output: input}` makes an output the next run's state for that input (a growing concat
  cache: TensorRT keeps it on the device and swaps buffers, nothing is copied).
Such outputs are not returned unless named in `outputs=`. Feeds for inputs the session does not
have are ignored (the forms drop inputs, e.g. the kv-cache form's attention_mask), so one feed
dict serves the original, fused and form models alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import TrtattnError


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype
    shape: tuple  # ints; -1 or a dim name where the axis is dynamic

    def row(self) -> dict:
        return {"name": self.name, "dtype": np.dtype(self.dtype).name, "shape": list(self.shape)}

    @property
    def dynamic(self) -> bool:
        return any(not isinstance(d, int) or d < 0 for d in self.shape)


def check_right_padded(model: str, name: str, mask: np.ndarray) -> None:
    """A padding mask read as per-row lengths must be each row's ones first (right padding): anything else
    would be answered wrongly, so it is refused."""
    m = np.asarray(mask)
    if m.ndim == 2 and m.shape[1] > 1:
        rows = np.flatnonzero((np.diff((m != 0).astype(np.int8), axis=1) > 0).any(axis=1))
        if rows.size:
            raise TrtattnError(f"{model}: {name} row {int(rows[0])} is not right-padded ({m[rows[0]].tolist()}); this "
                               "model reads it as per-row lengths (the padded form): put each row's tokens first")


class Session:
    """Base class: `run` checks the feeds and the state, back ends implement `_run`."""

    backend = "?"

    def __init__(self, name: str, inputs: list[TensorInfo], outputs: list[TensorInfo], aliases: dict[str, str],
                 sidecar: dict | None = None):
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.aliases = dict(aliases)
        self.sidecar = sidecar
        self.form = (sidecar or {}).get("form")
        # padding masks the model reads as per-row lengths (the padded form): a left-padded one is refused
        self.right_padded = tuple(((sidecar or {}).get("io") or {}).get("right_padded") or ())
        self._inputs = {i.name: i for i in inputs}
        self._outputs = {o.name: o for o in outputs}
        for out, inp in self.aliases.items():
            if out not in self._outputs or inp not in self._inputs:
                raise TrtattnError(f"{name}: alias {out} -> {inp} names a tensor the model does not have")

    # ---------------------------------------------------------------- description
    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    def input(self, name: str) -> TensorInfo:
        return self._inputs[name]

    def output(self, name: str) -> TensorInfo:
        return self._outputs[name]

    def contract(self) -> dict:
        """The I/O contract, in the sidecar's `io` layout."""
        return {"inputs": [i.row() for i in self.inputs], "outputs": [o.row() for o in self.outputs],
                "aliases": dict(self.aliases)}

    # ---------------------------------------------------------------- state
    def set_state(self, name: str, value: np.ndarray) -> None:
        raise NotImplementedError

    def get_state(self, name: str) -> np.ndarray:
        """A host copy of a state input (for inspection; decoding never needs it)."""
        raise NotImplementedError

    def zeros_state(self, name: str, shape) -> None:
        """A zero-filled state of this shape (a preallocated cache), made where the back end keeps state."""
        if name not in self._inputs:
            raise TrtattnError(f"{self.name}: no input named {name}")
        self.set_state(name, np.zeros(tuple(shape), self._inputs[name].dtype))

    def has_state(self, name: str) -> bool:
        raise NotImplementedError

    def state_shape(self, name: str) -> tuple:
        raise NotImplementedError

    # ---------------------------------------------------------------- running
    def run(self, feeds: dict[str, np.ndarray], *, outputs: list[str] | None = None,
            carry: dict[str, str] | None = None) -> dict[str, np.ndarray]:
        carry = dict(carry or {})
        for out, inp in carry.items():
            if out not in self._outputs or inp not in self._inputs:
                raise TrtattnError(f"{self.name}: cannot carry {out} into {inp}: no such output or input")
        own = {}
        for name, value in feeds.items():
            if name in self._inputs:
                own[name] = self._cast(name, value)
        for name in self.right_padded:
            if name in own:
                check_right_padded(self.name, name, own[name])
        missing = [i.name for i in self.inputs if i.name not in own and not self.has_state(i.name)]
        if missing:
            raise TrtattnError(f"{self.name}: no value for input{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(missing)} (feed {'them' if len(missing) > 1 else 'it'} or set_state)")
        kept = {o for o, i in self.aliases.items() if self.has_state(i) and i not in own} | set(carry)
        if outputs is None:
            wanted = [o.name for o in self.outputs if o.name not in kept]
        else:
            unknown = [o for o in outputs if o not in self._outputs]
            if unknown:
                raise TrtattnError(f"{self.name}: no output named {', '.join(unknown)}")
            wanted = list(outputs)
        return self._run(own, wanted, carry)

    def _cast(self, name: str, value) -> np.ndarray:
        want = np.dtype(self._inputs[name].dtype)
        value = np.asarray(value)
        if value.dtype != want:
            if value.dtype.kind != want.kind and not (value.dtype.kind in "iub" and want.kind in "iub"):
                raise TrtattnError(f"{self.name}: input {name} is {want.name}, got {value.dtype.name}")
            value = value.astype(want)
        return np.ascontiguousarray(value)

    def _run(self, feeds: dict, wanted: list[str], carry: dict[str, str]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    # ---------------------------------------------------------------- resources
    def memory(self) -> dict:
        """{"kind": ..., "bytes": ...}: what this back end can say about memory in use now."""
        return {"kind": "unknown", "bytes": None}

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {len(self.inputs)} inputs, {len(self.outputs)} outputs>"
