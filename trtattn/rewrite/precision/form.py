"""A verified form (routes/prepare) in fp16 / bf16: AutoCast on the fp32 form, then checked against it.

    result = convert_form(form_model, "fp16", feeds, caches=derived.cache_updates)
    result.model, result.table, result.errors        # the model TensorRT gets, its matmul work per dtype

The form's IO types are kept (AutoCast's keep_io_types) unless `keep_io_types=False`, with one exception:
a preallocated cache is updated in place, so it cannot change dtype on the way: caches live in the
attention's dtype (AutoCast would cast them on the way in and out, which breaks the in-place update and
copies the whole cache every step). The check runs the fp32 form, which was verified against the original
model to 1e-4, and the converted one on the same feeds; CONVERSION_BOUNDS[precision] bounds every output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...errors import TrtattnError
from ...graph.emit import export_like
from ...graph.precision import LOW_FLOATS
from ...graph.user_inputs import InputsUsed
from ...verify.tolerance import CONVERSION_BOUNDS
from .autocast import convert
from .check import OutputError, verified


@dataclass(frozen=True)
class PrecisionCheck:
    """The converted form against the fp32 form, as routes/prepare keeps it (Prepared.precision_check). Made only
    when the check passed: convert_form raises past the tolerance."""

    precision: str
    tolerance: dict[str, float]
    run_on: str  # what ran the converted form (check.cpu_runner)
    max_rel: float  # the worst output's max_abs / max |reference|
    max_rel_l2: float
    outputs: dict[str, OutputError]  # per output
    inputs: InputsUsed | None = None  # the user's inputs it ran on (None: the form's generated feeds)


@dataclass
class FormPrecision:
    model: onnx.ModelProto
    precision: str
    table: dict[str, float]  # share of matmul work per dtype
    kept_fp32: dict[str, str]  # node -> why it stays fp32
    errors: dict[str, OutputError] = field(default_factory=dict)  # per output, against the fp32 form
    tolerance: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    runner: str = ""  # what ran the converted form for the check (check.cpu_runner)

    def summary(self, inputs: InputsUsed | None = None) -> PrecisionCheck:
        worst = max(self.errors.values(), key=lambda e: e.rel, default=None)
        return PrecisionCheck(self.precision, self.tolerance, self.runner, worst.rel if worst else 0.0,
                              max((e.rel_l2 for e in self.errors.values()), default=0.0), dict(self.errors), inputs)


def convert_form(form_model: onnx.ModelProto, precision: str, feeds: list[dict], *, caches=(),
                 keep_io_types: bool = True) -> FormPrecision:
    """AutoCast `form_model` (calibrated on `feeds`, the form's own inputs), caches into the attention's
    dtype, verified against the fp32 form on the same feeds (VerificationError past the tolerance)."""
    if precision not in LOW_FLOATS:
        raise TrtattnError(f"unknown precision '{precision}'; choose one of: {', '.join(LOW_FLOATS)}")
    converted = convert(form_model, precision, keep_io_types=keep_io_types, calibration_feeds=feeds)
    model = caches_in_low_precision(converted.model, caches, precision) if caches else converted.model
    errors, runner = verified(form_model, model, feeds, precision=precision)
    notes = [f"{len(converted.kept_fp32)} nodes stay fp32 (AutoCast's classifier and trtattn's rules)",
             f"the {precision} form checked against the fp32 form on {runner}"]
    if caches:
        notes.append(f"the KV caches are {precision}: updated in place, they take the attention's dtype")
    return FormPrecision(model, precision, converted.table, converted.kept_fp32, errors, dict(CONVERSION_BOUNDS[precision]),
                         notes, runner)


def caches_in_low_precision(model: onnx.ModelProto, caches, precision: str) -> onnx.ModelProto:
    """Every cache input, its in-place update and the output aliasing it in `precision`: the Casts AutoCast
    put on the way in and out go, the update's new tokens are cast instead."""
    elem = onnx.TensorProto.FLOAT16 if precision == "fp16" else onnx.TensorProto.BFLOAT16
    dtype = elem  # onnx-graphsurgeon takes ONNX element types (numpy has no bfloat16)
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    nodes = {n.name: n for n in graph.nodes}
    for c in caches:
        cache, write = tensors[c.cache], nodes.get(c.node)
        if write is None:
            raise TrtattnError(f"the converted form has no cache update {c.node}")
        cache.dtype = dtype
        for reader in list(cache.outputs):  # AutoCast's Cast of the cache input: read the cache itself
            if reader.op == "Cast" and reader.attrs.get("to") == elem:
                _redirect(reader.outputs[0], cache)
        written, final = write.outputs[0], tensors[c.output]
        if final is not written:  # written -> Cast -> the graph output: the update writes the output itself
            final.inputs.clear()
            write.outputs = [final]
            _redirect(written, final)
        final.dtype = dtype
        at = 1 if write.op == "TensorScatter" else 2  # the new tokens: TensorScatter(cache, update, indices)
        update = write.inputs[at]
        if update.dtype is not None and _elem(update.dtype) != elem:
            cast = gs.Variable(f"{update.name}/{precision}", dtype=dtype)
            graph.nodes.append(gs.Node("Cast", f"{c.node}/update_{precision}", {"to": elem}, inputs=[update],
                                       outputs=[cast]))
            write.inputs[at] = cast
    return export_like(graph, model)


def _elem(dtype) -> int:
    """onnx-graphsurgeon's dtype (a numpy dtype, or an ONNX element type where numpy has none) as ONNX's."""
    return dtype if isinstance(dtype, int) else onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _redirect(old: gs.Tensor, new: gs.Tensor) -> None:
    for consumer in list(old.outputs):
        for i, x in enumerate(consumer.inputs):
            if x is old:
                consumer.inputs[i] = new
