"""The trt:: ops as ONNX Runtime custom ops: onnxruntime-extensions Python ops over reference.py.

onnxruntime-extensions' Python ops (0.15) cannot take the written nodes as they are: they live in
the ai.onnx.contrib domain, take a fixed list of inputs (no optional ones) of fixed dtypes (no
float16), need every declared attribute on the node, and a Python exception inside one aborts the
process (std::terminate). Hence:

- each op is registered once per combination of given optional inputs and mask kind (bool or
  additive), named like `TRT_Attention__attn_mask_bool__kv_lengths` (see `variant_name`);
- cpu_model.py turns a model's trt nodes into these variants, in a copy used only on CPU;
- the kernels never raise: an error is recorded under the session's tag with the node's name and
  the output is NaN; Session.run (session.py) raises it as TrtOpError.
"""

from __future__ import annotations

import importlib.abc
import itertools
import os
import sys
import threading
from collections.abc import Callable

import numpy as np

from . import reference, schema
from .schema import OpSchema

CONTRIB = "ai.onnx.contrib"  # the only domain onnxruntime-extensions' Python ops can be in

# Attributes the CPU copy adds to every kernel node: which node it was, which session runs it,
# what a fully masked row gives, and which documented attributes the original left unset.
RUNNER_ATTRIBUTES = ("trt_node", "trt_session", "fully_masked", "absent")

# Documented attribute -> reference keyword (None: no numerical effect).
_RENAMED = {"TRT_normalization_op": "normalization_op", "TRT_decomposable": None}
_FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {  # op type -> its numpy reference
    "TRT_Attention": reference.trt_attention,
    "TRT_QuantizedAttention": reference.trt_quantized_attention,
    "TRT_KVCacheUpdate": reference.trt_kv_cache_update,
}


def variant_name(op_type: str, given: tuple[str, ...], mask_kind: str | None) -> str:
    """The registered op for these given optional inputs (documented names) and mask kind."""
    spec = schema.OPS[op_type]
    parts = [op_type]
    for name in given:
        if spec.inputs[spec.index(name)].optional:
            parts.append(f"attn_mask_{mask_kind}" if name == "attn_mask" else name)
    return "__".join(parts)


def _variants(spec: OpSchema):
    """(given input names in order, mask kind) for every combination the CPU copy can produce."""
    optional = [x.name for x in spec.inputs if x.optional and x.name != "normalization_quantize_scale"]
    for flags in itertools.product((False, True), repeat=len(optional)):
        chosen = {n for n, f in zip(optional, flags) if f}
        if spec is schema.TRT_QUANTIZED_ATTENTION:
            chosen.add("normalization_quantize_scale")  # required (check_node rejects its absence)
        given = tuple(x.name for x in spec.inputs if not x.optional or x.name in chosen)
        for mask_kind in (("bool", "float") if "attn_mask" in chosen else (None,)):
            yield given, mask_kind


# ----------------------------------------------------------------------------- events

_EVENTS: dict[str, list[tuple[str, str, str]]] = {}
_LOCK = threading.Lock()
_KEEP = 100  # per tag: copies run outside Session (tag "") are never collected


def _record(tag: str, node: str, kind: str, messages) -> None:
    with _LOCK:
        events = _EVENTS.setdefault(tag, [])
        events.extend((kind, node, m) for m in messages)
        del events[:-_KEEP]


def take_events(tag: str) -> list[tuple[str, str, str]]:
    """(kind "error" or "note", node name, message) recorded by the kernels for this tag, cleared."""
    with _LOCK:
        return _EVENTS.pop(tag, [])


# ----------------------------------------------------------------------------- kernels


def _kernel(spec: OpSchema, given: tuple[str, ...]):
    function = _FUNCTIONS[spec.op_type]

    def compute(*arrays, trt_node, trt_session, fully_masked, absent, **attributes):
        notes: list[str] = []
        try:
            kwargs = {name.lower(): array for name, array in zip(given, arrays)}
            unset = set(absent.split(",")) if absent else set()
            for name, value in attributes.items():
                key = _RENAMED.get(name, name)
                if name not in unset and key is not None:
                    kwargs[key] = value
            if spec is not schema.TRT_KV_CACHE_UPDATE:
                kwargs["fully_masked"] = fully_masked
            out = np.ascontiguousarray(function(**kwargs, notes=notes), np.float32)
            _record(trt_session, trt_node, "note", notes)
            return out
        except Exception as error:  # noqa: BLE001 - an exception crossing into ONNX Runtime aborts the process
            _record(trt_session, trt_node, "error", [f"{type(error).__name__}: {error}"])
            return np.full(np.shape(arrays[0]), np.nan, np.float32)

    return compute


_REGISTERED = False
_REGISTER_LOCK = threading.Lock()


def _register() -> None:
    """Register every variant with onnxruntime-extensions, once per process."""
    global _REGISTERED
    with _REGISTER_LOCK:
        if _REGISTERED:
            return
        ortx = _import_ortx()
        types = ortx.PyCustomOpDef
        attr_types = {"INT": types.dt_int64, "FLOAT": types.dt_float, "STRING": types.dt_string}
        for spec in schema.OPS.values():
            attrs = {a.name: attr_types[a.type] for a in spec.attributes}
            attrs.update({name: types.dt_string for name in RUNNER_ATTRIBUTES})
            for given, mask_kind in _variants(spec):
                inputs = []
                for name in given:
                    dtypes = spec.inputs[spec.index(name)].dtypes
                    if dtypes == ("int32",):
                        inputs.append(types.dt_int32)
                    else:
                        inputs.append(types.dt_bool if name == "attn_mask" and mask_kind == "bool" else types.dt_float)
                ortx.onnx_op(op_type=variant_name(spec.op_type, given, mask_kind), inputs=inputs,
                             outputs=[types.dt_float], attrs=attrs)(_kernel(spec, given))
        _REGISTERED = True


# What onnxruntime_extensions imports only for its tokenizer and audio converters (its `cvt` module, run by
# its __init__): transformers, tokenizers and torch, 8 s of a CLI process when none is loaded yet. It
# imports each inside try/except ImportError and goes on without it; the kernels here need none of them.
_CONVERTER_PACKAGES = frozenset({"transformers", "tokenizers", "torch"})


class _WithoutConverterPackages(importlib.abc.MetaPathFinder):
    """An import finder that answers 'not installed' for the converter packages not loaded yet."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _CONVERTER_PACKAGES and top not in sys.modules:
            raise ModuleNotFoundError(f"{name} left out while importing onnxruntime_extensions", name=name)
        return None


def _import_ortx():
    # Importing onnxruntime_extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python for the
    # process, which would make every later Python subprocess parse ONNX files with pure-Python
    # protobuf; put the variable back as it was. The converter packages it would import are left out
    # (already loaded ones stay: the finder is asked only about modules not in sys.modules).
    if "onnxruntime_extensions" in sys.modules:
        return sys.modules["onnxruntime_extensions"]
    saved = os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
    finder = _WithoutConverterPackages()
    sys.meta_path.insert(0, finder)
    try:
        try:
            import onnxruntime_extensions
        except ImportError:  # a version that needs one of them after all: imported as it is, slower
            sys.meta_path.remove(finder)
            import onnxruntime_extensions
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        if saved is None:
            os.environ.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
        else:
            os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = saved
    return onnxruntime_extensions


def session_options(options=None):
    """`onnxruntime.SessionOptions` (new, or the given fresh ones) with the trt:: kernels
    registered. They run models made by `cpu_model`, not the written model itself."""
    import onnxruntime as ort

    _register()
    if options is None:
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: no optimizer chatter ("UnsqueezeElimination cannot remove")
    options.register_custom_ops_library(_import_ortx().get_library_path())
    return options
