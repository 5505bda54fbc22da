"""precision: whole-model FP16 / BF16 by NVIDIA ModelOpt's AutoCast, measured and checked on ONNX Runtime.

    converted = convert(model, "fp16", calibration_feeds=[feeds])
    converted.model         # the mixed-precision model (IO types kept unless keep_io_types=False)
    converted.kept_fp32     # {node: why AutoCast kept it in fp32}
    converted.table         # precision_table at the calibration shapes: {"fp16": 0.99, "fp32": 0.01}
    errors = verify(original, converted.model, [feeds])   # raises VerificationError past TOLERANCE

TensorRT >= 11 networks are strongly typed: the dtypes in the ONNX model are the engine's. AutoCast
(`modelopt.onnx.autocast.convert_to_mixed_precision`) converts the model; its classifier keeps in
fp32 every node whose inputs or outputs exceed 512 in magnitude on the calibration data (masks built
from finfo(float32).min, their Where/Add, the Softmax that reads them) or whose initializers exceed
fp16's range; this module never re-decides that. What it adds, each for a reason AutoCast cannot see:

- every standard ONNX `Attention` node is forced into the low precision (AutoCast's `nodes_to_include`):
  its mask input holds finfo(float32).min, so the range rule would keep the whole attention in fp32,
  while TensorRT's IAttention runs in its query's dtype and wants the mask in that dtype too;
- fp16 only: that mask is clamped to finfo(float16).min in fp32 before AutoCast's Cast, which would
  otherwise turn -3.4e38 into -inf (a fully masked row is then NaN in TensorRT's softmax). bf16 has
  fp32's range and needs no clamp;
- the rotary angles (the float nodes between the position ids and Sin/Cos) stay fp32: position x
  frequency is < 512 at short calibration lengths, but fp16 spaces values 2**-5 apart at 32..64 and
  0.25 at 256..512, and Sin/Cos of a rounded angle is off by that much.

AutoCast facts this module relies on (0.47): it reads a model from a path (external data included;
it loads all weights, deep-copies the model twice and runs ONNX Runtime over every tensor, so its
peak is several times the weights); fp16 keeps the model's opset when >= 13, bf16 raises it to 22
(onnxscript's converter); it drops metadata_props (restored here). Ops outside the ONNX domains are
TensorRT plugins to it (it needs TensorRT to read them) and it moves com.microsoft ops named like an
ONNX op (Attention, RotaryEmbedding) into the ONNX domain, whose inputs differ: such models are refused
here with the nodes named.

ONNX Runtime's CPU provider (1.32) runs every op of the fp16 models (some through its own fp32 casts),
but has no bfloat16 kernel for MatMul, Gemm, Conv, Add, Mul, Softmax, Attention, ...: a bf16 model is
checked with onnx's reference evaluator instead (numpy over ml_dtypes' bfloat16), and `verify` says so.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from ..errors import MissingDependencyError, TrtattnError, VerificationError, require

PRECISIONS = ("fp16", "bf16")
INSTALL = "pip install 'trtattn[quant]' (NVIDIA ModelOpt without its onnxruntime-gpu)"

# Tolerance of a converted model against the fp32 original, per output: "rel" bounds the largest error
# relative to the output's largest value (max |new - ref| / max |ref|: a wrong row shows), "rel_l2" the
# relative L2 error (||new - ref|| / ||ref||). Measured on the 22 TorchScript zoo exports and their fused
# forms (feeds with padding, seq 7-12; Llama, T5, Gemma 3 and BART fused also at seq 32 and 60):
# fp16 rel 0.0007-0.0052, rel_l2 <= 0.0024 (T5, seq 60); bf16 rel 0.012-0.10, rel_l2 <= 0.049 (T5).
TOLERANCE = {"fp16": {"rel": 0.02, "rel_l2": 0.01}, "bf16": {"rel": 0.2, "rel_l2": 0.1}}

MATMUL_OPS = ("MatMul", "Gemm", "Conv", "Attention")
# Ops with matmul work that precision_table does not count: it refuses a model that has them.
_UNCOUNTED = {"ConvTranspose", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "Einsum"}
_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
_DTYPES = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16",
           onnx.TensorProto.DOUBLE: "fp64", onnx.TensorProto.FLOAT8E4M3FN: "fp8", onnx.TensorProto.INT8: "int8",
           onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.FLOAT4E2M1: "fp4", onnx.TensorProto.INT4: "int4"}
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
_NO_MATH = {"Constant", "ConstantOfShape", "Cast", "Shape", "Size", "Identity"}
ROTARY_FP32 = False
DEFAULT_DIM = 16  # a symbolic dim nobody bound (precision_table without shapes)


class PrecisionError(TrtattnError):
    """AutoCast could not convert the model, or its matmul work cannot be counted."""


class NotRunnableOnCpu(TrtattnError):
    """Neither ONNX Runtime's CPU provider nor onnx's reference evaluator runs the converted model."""


@dataclass
class Converted:
    """What AutoCast made of a model."""

    model: onnx.ModelProto
    precision: str
    kept_fp32: dict[str, str]  # node name -> why it computes in fp32 (AutoCast's log, or ours)
    table: dict[str, float]  # precision_table(model) at the calibration shapes
    log: str = field(default="", repr=False)  # AutoCast's log, for --debug


# ---------------------------------------------------------------- conversion
def convert(model: onnx.ModelProto | str | os.PathLike, precision: str, *, keep_io_types: bool = True,
            keep_fp32: Sequence[str] = (), calibration_feeds: Mapping | Sequence[Mapping] | None = None) -> Converted:
    """Convert `model` (a ModelProto, not modified, or a path: nothing is loaded beyond the graph)
    to fp16 or bf16 with AutoCast. keep_fp32: node names that stay fp32. calibration_feeds: one feed
    dict or a list of them (AutoCast's classifier reads every tensor's range on them); None lets
    AutoCast draw uniform [-1, 1] inputs with every dynamic dim 1, which says little about masks."""
    if precision not in PRECISIONS:
        raise TrtattnError(f"unknown precision '{precision}'; choose one of: {', '.join(PRECISIONS)}")
    autocast = _autocast()
    feeds = [calibration_feeds] if isinstance(calibration_feeds, Mapping) else list(calibration_feeds or [])
    with tempfile.TemporaryDirectory(prefix="trtattn-autocast-") as tmp:
        work, src_dir = _working_copy(model, Path(tmp))
        _refuse_foreign_ops(work)
        _name_nodes(work)
        names = {n.name for n in work.graph.node}
        missing = [n for n in keep_fp32 if n not in names]
        if missing:
            raise TrtattnError(f"keep_fp32 names no node of the model: {', '.join(missing)}")
        ours = {n: "asked (keep_fp32)" for n in keep_fp32}
        if precision == "fp16":
            ours.update({n: "clamps an attention mask to fp16's range before its Cast" for n in _clamp_masks(work)})
        ours.update({n: "rotary angle: fp16/bf16 cannot hold position x frequency"
                     for n in _rotary_angles(work, _elem_types(work))})
        attentions = [n.name for n in work.graph.node if n.op_type == "Attention" and n.domain in _ONNX_DOMAINS]
        path = Path(tmp) / "model.onnx"
        _save(work, path, src_dir)
        calib = None
        if feeds:
            calib = Path(tmp) / "calibration"
            calib.mkdir()
            for i, f in enumerate(feeds):  # one .npz per batch: AutoCast aggregates the ranges
                np.savez(calib / f"{i:04d}.npz", **{k: np.asarray(v) for k, v in f.items()})
        del work
        log = io.StringIO()
        try:
            with _captured(log):
                out = autocast.convert_to_mixed_precision(
                    str(path), low_precision_type=precision, keep_io_types=keep_io_types,
                    nodes_to_exclude=[re.escape(n) + "$" for n in sorted(ours)],
                    nodes_to_include=[re.escape(n) + "$" for n in attentions] or None,
                    calibration_data=str(calib) if calib else None, providers=["cpu"])
        except TrtattnError:
            raise
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            error = PrecisionError(f"AutoCast {precision} conversion failed: {type(e).__name__}: {first}")
            error.log = log.getvalue()
            raise error from None
    original_props = model.metadata_props if isinstance(model, onnx.ModelProto) else onnx.load(
        str(model), load_external_data=False).metadata_props
    if not out.metadata_props:
        out.metadata_props.extend(copy.deepcopy(list(original_props)))
    text = log.getvalue()
    kept = _kept_fp32(out, text, ours)
    return Converted(out, precision, kept, precision_table(out, feeds[0] if feeds else None), text)


def _autocast():
    """modelopt.onnx.autocast, imported lazily (its import logs: kept quiet)."""
    with _captured(io.StringIO()):
        try:
            return require("modelopt.onnx.autocast", "fp16/bf16 conversion (NVIDIA ModelOpt's AutoCast)", INSTALL)
        except MissingDependencyError:
            raise
        except Exception as e:  # ModelOpt present but its ONNX side cannot import
            raise MissingDependencyError(f"fp16/bf16 conversion needs NVIDIA ModelOpt's AutoCast ({e}); "
                                         f"install it with: {INSTALL}") from None


def _working_copy(model, tmp: Path) -> tuple[onnx.ModelProto, Path | None]:
    """A copy to edit. From a path only the graph is loaded; its external data files are linked
    into `tmp`, where AutoCast reads them."""
    if isinstance(model, onnx.ModelProto):
        return copy.deepcopy(model), None
    src = Path(model)
    if not src.is_file():
        raise TrtattnError(f"{src}: no such model file")
    return onnx.load(str(src), load_external_data=False), src.parent


def _save(work: onnx.ModelProto, path: Path, src_dir: Path | None) -> None:
    if src_dir is not None:  # weights stay where they are: link each external file
        for init in work.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location" and not (path.parent / entry.value).exists():
                    link = path.parent / entry.value
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to((src_dir / entry.value).resolve())
        onnx.save_model(work, str(path))
        return
    large = work.ByteSize() > 2**31 - 1 - 2**24
    onnx.save_model(work, str(path), save_as_external_data=large, all_tensors_to_one_file=True,
                    location="model.onnx.data" if large else None)


def _refuse_foreign_ops(model: onnx.ModelProto) -> None:
    foreign = [f"{n.name or n.op_type} ({n.domain}:{n.op_type})" for n in model.graph.node
               if n.domain not in _ONNX_DOMAINS]
    if foreign:
        raise PrecisionError(
            f"AutoCast cannot convert ops outside the ONNX domain: {', '.join(foreign[:6])}"
            f"{' ...' if len(foreign) > 6 else ''}. It reads them as TensorRT plugins (it needs TensorRT "
            "for that) and moves com.microsoft ops named like an ONNX op (Attention, RotaryEmbedding) "
            "into the ONNX domain, whose inputs differ; convert them to standard ONNX ops first (trtattn fuse)")


def _name_nodes(model: onnx.ModelProto) -> None:
    """Unique names for every node: AutoCast's rules and its report go by name."""
    used = {n.name for n in model.graph.node if n.name}
    seen: set[str] = set()
    for i, n in enumerate(model.graph.node):
        if n.name and n.name not in seen:
            seen.add(n.name)
            continue
        base, k = f"{n.name or 'trtattn/' + n.op_type}_{i}", 0
        while f"{base}_{k}" in used:
            k += 1
        n.name = f"{base}_{k}" if n.name else base
        used.add(n.name)
        seen.add(n.name)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = _inferred(_structure(model))
    types = {i.name: i.data_type for i in model.graph.initializer}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def _clamp_masks(model: onnx.ModelProto) -> list[str]:
    """Max(mask, finfo(fp16).min) in fp32 on every float attn_mask of an Attention: the nodes added."""
    types = _elem_types(model)
    clamped: dict[str, str] = {}
    added = []
    floor = "trtattn/fp16_mask_floor"
    position = 0
    while position < len(model.graph.node):
        node = model.graph.node[position]
        mask = node.input[3] if node.op_type == "Attention" and len(node.input) > 3 else ""
        if mask and types.get(mask) == onnx.TensorProto.FLOAT:
            if mask not in clamped:
                clamped[mask] = f"{mask}/fp16_clamped"
                clamp = onnx.helper.make_node("Max", [mask, floor], [clamped[mask]], name=f"{node.name}/fp16_mask_clamp")
                model.graph.node.insert(position, clamp)
                added.append(clamp.name)
                position += 1
            node.input[3] = clamped[mask]
        position += 1
    if added:
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(np.finfo(np.float16).min, np.float32), floor))
    return added


def _rotary_angles(model: onnx.ModelProto, types: dict[str, int]) -> list[str]:
    """Sin/Cos of angles computed from positions alone, and the float nodes computing those angles.

    "From positions alone": every input is a weight, a constant or an integer tensor, or is computed
    from such inputs only; a Sin/Cos of an activation is not a rotary angle and is left to AutoCast."""
    derived = {i.name for i in model.graph.initializer}
    derived |= {t for t, ty in types.items() if ty not in _FLOATS}
    for n in model.graph.node:  # topological order
        if all(t in derived for t in n.input if t):
            derived.update(n.output)
    producer = {o: n for n in model.graph.node for o in n.output}
    keep: list[str] = []
    frontier = [n for n in model.graph.node if n.op_type in ("Sin", "Cos") and n.output[0] in derived]
    while frontier:
        node = frontier.pop()
        if node.name in keep:
            continue
        if any(types.get(t) in _FLOATS for t in node.output):
            keep.append(node.name)
        for t in node.input:
            p = producer.get(t)
            if p is not None and types.get(t) in _FLOATS and t in derived:
                frontier.append(p)
    return keep


def _kept_fp32(model: onnx.ModelProto, log: str, ours: dict[str, str]) -> dict[str, str]:
    """Every node that computes in fp32 in the converted model, with AutoCast's reason where it gave one."""
    reasons = {}
    for m in re.finditer(r"Skipping node (.+?): (.+)$", log, re.M):
        reasons.setdefault(m.group(1), m.group(2).strip())
    unsupported = re.search(r"ops are not supported in '(\w+)' in opset (\d+).*?(\{.*\})", log)
    types = {i.name: i.data_type for i in model.graph.initializer}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        types[vi.name] = vi.type.tensor_type.elem_type
    kept = {}
    for n in model.graph.node:
        if n.op_type in _NO_MATH or not any(types.get(t) == onnx.TensorProto.FLOAT for t in [*n.input, *n.output] if t):
            continue
        why = ours.get(n.name) or reasons.get(n.name)
        if why is None and unsupported and f"'{n.op_type}'" in unsupported.group(3):
            why = f"{n.op_type} has no {unsupported.group(1)} in ONNX opset {unsupported.group(2)}"
        kept[n.name] = why or "fp32 by AutoCast (no reason logged)"
    return kept


@contextlib.contextmanager
def _captured(buffer: io.StringIO):
    """AutoCast's log (its own stdout handler, ModelOpt's root-logger warnings, stdout) into `buffer`."""
    root, autocast = logging.getLogger(), logging.getLogger("modelopt.onnx.autocast")
    saved = root.handlers[:], root.level, autocast.handlers[:], autocast.level, autocast.propagate
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s - %(message)s"))
    root.handlers[:] = [handler]
    autocast.handlers[:] = []
    autocast.setLevel(logging.INFO)
    autocast.propagate = True
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.handlers[:], level, autocast.handlers[:], autocast_level, autocast.propagate = saved
        root.setLevel(level)
        autocast.setLevel(autocast_level)


# ---------------------------------------------------------------- matmul work per dtype
@dataclass(frozen=True)
class Work:
    node: str
    op_type: str
    dtype: str
    macs: int


def precision_table(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None, *,
                    shapes: Mapping[str, Sequence[int]] | None = None,
                    dims: Mapping[str, int] | None = None) -> dict[str, float]:
    """Share of the matmul work (multiply-accumulates of every MatMul, Gemm, Conv and Attention) per
    dtype of the inputs that feed it, largest first. See matmul_work for the shapes it counts at."""
    work = matmul_work(model, feeds, shapes=shapes, dims=dims)
    total = sum(w.macs for w in work)
    shares: dict[str, int] = {}
    for w in work:
        shares[w.dtype] = shares.get(w.dtype, 0) + w.macs
    return {k: v / total for k, v in sorted(shares.items(), key=lambda kv: -kv[1])} if total else {}


def matmul_work(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None, *,
                shapes: Mapping[str, Sequence[int]] | None = None,
                dims: Mapping[str, int] | None = None) -> list[Work]:
    """One Work per matmul node: its multiply-accumulates and the dtype it runs in.

    The inputs take the shapes of `feeds`, else `shapes` (e.g. a profile's opt shapes), else their
    symbolic dims take `dims`, else DEFAULT_DIM; ONNX's shape inference carries them through the
    graph. Where it loses a dim (a Slice at x.shape[-1] // 2 in RoPE, a broadcast against batch 1),
    the model is run on `feeds` (ONNX Runtime, or onnx's reference evaluator for bf16) for the exact
    shapes; without feeds that is an error naming the tensor."""
    nodes = []
    for n in model.graph.node:
        counted = n.domain in _ONNX_DOMAINS and n.op_type in MATMUL_OPS
        if not counted and (n.op_type in _UNCOUNTED or "Attention" in n.op_type or "MatMul" in n.op_type
                            or n.op_type in MATMUL_OPS):
            raise PrecisionError(f"precision_table cannot count the matmul work of {n.domain or 'ai.onnx'}:"
                                 f"{n.op_type} (node {n.name}); convert it to standard ONNX ops first")
        if counted:
            nodes.append(n)
    if feeds is not None:
        shapes = {k: np.shape(v) for k, v in feeds.items()}
    types, static = _static_shapes(model, shapes or {}, dims or {})
    missing = sorted({t for n in nodes for t in _shaped_tensors(n) if t not in static})
    if missing and feeds is not None:
        static.update(_run_shapes(model, missing, feeds))
    unresolved = [(n, t) for n in nodes for t in _shaped_tensors(n) if t not in static]
    if unresolved:
        n, t = unresolved[0]
        raise PrecisionError(f"no static shape for '{t}' ({n.op_type} {n.name}) from ONNX's shape inference: "
                             "pass feeds to count it from a run")
    producer = {o: n for n in model.graph.node for o in n.output}
    return [Work(n.name, n.op_type, _dtype_of(n.input[0], types, producer), _macs(n, static)) for n in nodes]


def _shaped_tensors(n: onnx.NodeProto) -> list[str]:
    """The tensors whose shapes give a matmul node's work."""
    if n.op_type == "Conv":
        return [n.input[1], n.output[0]]
    if n.op_type == "Attention":
        return [t for i, t in enumerate(n.input[:5]) if t and i != 3]
    return list(n.input[:2])


def _static_shapes(model, shapes, dims) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Elem types and the fully static shapes ONNX's inference finds with the inputs bound."""
    view = _structure(model)
    inits = {i.name for i in model.graph.initializer}
    for vi in view.graph.input:
        if vi.name in inits:
            continue
        given, dim_list = shapes.get(vi.name), vi.type.tensor_type.shape.dim
        if given is not None and len(given) != len(dim_list):
            raise PrecisionError(f"shape {list(given)} for input '{vi.name}' has rank {len(given)}; "
                                 f"the model's has {len(dim_list)}")
        for i, d in enumerate(dim_list):
            value = given[i] if given is not None else (
                d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, DEFAULT_DIM))
            d.Clear()
            d.dim_value = int(value)
    inferred = _inferred(view)
    types = {i.name: i.data_type for i in model.graph.initializer}
    static = {i.name: list(i.dims) for i in model.graph.initializer}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        types[vi.name] = tt.elem_type
        dims_ = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if tt.HasField("shape") and None not in dims_:
            static[vi.name] = dims_
    return types, static


def _run_shapes(model: onnx.ModelProto, names: list[str], feeds) -> dict[str, list[int]]:
    """The shapes of `names` in a run of the model on `feeds`."""
    probe = copy.deepcopy(model)
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in outputs)
    run, _ = _cpu_runner(probe)
    cast = _input_casts(probe)
    got = run({k: (np.asarray(v).astype(cast[k]) if k in cast else v) for k, v in feeds.items()})
    return {t: list(np.shape(got[t])) for t in names if t in got}


def _macs(n: onnx.NodeProto, static: dict[str, list[int]]) -> int:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    if n.op_type == "MatMul":
        a, b = static[n.input[0]], static[n.input[1]]
        m, k = (a[-2] if len(a) > 1 else 1), a[-1]
        cols = b[-1] if len(b) > 1 else 1
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        return int(np.prod(batch, dtype=np.int64)) * m * k * cols
    if n.op_type == "Gemm":
        a, b = static[n.input[0]], static[n.input[1]]
        m, k = (a[1], a[0]) if attrs.get("transA") else (a[0], a[1])
        return m * k * (b[0] if attrs.get("transB") else b[1])
    if n.op_type == "Conv":  # every output element: in_channels / group x kernel volume
        return int(np.prod(static[n.output[0]], dtype=np.int64)) * int(np.prod(static[n.input[1]][1:], dtype=np.int64))
    # Attention: Q [B, Nq, Sq, H] or [B, Sq, Nq*H]; K, V likewise with Nkv; past_key adds to Skv.
    q, k, v = static[n.input[0]], static[n.input[1]], static[n.input[2]]
    if len(q) == 4:
        batch, heads, sq, head = q
        skv, head_v = k[2], v[3]
    else:
        heads, kv_heads = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
        if not heads or not kv_heads:
            raise PrecisionError(f"Attention {n.name} has 3-D inputs but no q_num_heads/kv_num_heads")
        batch, sq, head = q[0], q[1], q[2] // heads
        skv, head_v = k[1], v[2] // kv_heads
    if len(n.input) > 4 and n.input[4]:
        skv += static[n.input[4]][2]
    return batch * heads * sq * skv * (head + head_v)


def _dtype_of(tensor: str, types: dict[str, int], producer) -> str:
    """The dtype a matmul runs in: its first input's, or the quantized type behind a DequantizeLinear."""
    seen = 0
    p = producer.get(tensor)
    while p is not None and p.op_type in ("Transpose", "Reshape") and seen < 4:
        p, seen = producer.get(p.input[0]), seen + 1
    if p is not None and p.op_type == "DequantizeLinear":
        tensor = p.input[0]
    return _DTYPES.get(types.get(tensor, 0), "unknown")


def _structure(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its weights' bytes (initializers keep name, type and dims; small ones, which
    shape inference may read as Reshape targets, keep their values)."""
    view = onnx.ModelProto()
    view.ir_version, view.producer_name = model.ir_version, model.producer_name
    view.opset_import.extend(model.opset_import)
    view.functions.extend(model.functions)
    g = model.graph
    view.graph.name = g.name
    view.graph.node.extend(g.node)
    view.graph.input.extend(g.input)
    view.graph.output.extend(g.output)  # value_info is left out: inference starts from the inputs
    for init in g.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= 1024 and init.data_location != onnx.TensorProto.EXTERNAL:
            view.graph.initializer.append(init)
        else:
            stub = view.graph.initializer.add()
            stub.name, stub.data_type = init.name, init.data_type
            stub.dims.extend(init.dims)
            stub.data_location = onnx.TensorProto.EXTERNAL
            stub.external_data.add(key="location", value="trtattn-weightless")
    return view


def _inferred(view: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(view, data_prop=True)
    except Exception as e:
        raise PrecisionError(f"ONNX shape inference failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


# ---------------------------------------------------------------- checking on CPU
@dataclass
class OutputError:
    max_abs: float  # over elements finite in both
    rel: float  # max_abs / max |reference|: the tolerance's measure
    rel_l2: float  # ||new - ref|| / ||ref||
    nonfinite: int  # elements NaN/inf in one model and not the same value in the other
    ref_max: float


def compare(original: onnx.ModelProto | str | os.PathLike, converted: onnx.ModelProto,
            feeds: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, OutputError], str]:
    """Every float output of `converted` against `original` (fp32, ONNX Runtime CPU) over `feeds`,
    worst case per output; and what ran the converted model."""
    reference = _ort(original)
    candidate, runner = _cpu_runner(converted)
    names = [o.name for o in reference.get_outputs()]
    cast = _input_casts(converted)
    errors: dict[str, OutputError] = {}
    for f in feeds:
        want = dict(zip(names, reference.run(names, dict(f))))
        got = candidate({k: (np.asarray(v).astype(cast[k]) if k in cast else v) for k, v in f.items()})
        for n in names:
            if n not in got:
                raise VerificationError(f"the converted model has no output '{n}'")
            if not np.issubdtype(np.asarray(want[n]).dtype, np.floating):
                continue
            e = _error(np.asarray(want[n], np.float64), np.asarray(got[n]).astype(np.float64))
            old = errors.get(n)
            errors[n] = e if old is None else OutputError(
                max(old.max_abs, e.max_abs), max(old.rel, e.rel), max(old.rel_l2, e.rel_l2),
                old.nonfinite + e.nonfinite, max(old.ref_max, e.ref_max))
    return errors, runner


def verify(original: onnx.ModelProto | str | os.PathLike, converted: onnx.ModelProto,
           feeds: Sequence[Mapping[str, np.ndarray]], *, precision: str | None = None,
           tolerance: Mapping[str, float] | None = None) -> dict[str, OutputError]:
    """compare(), then a VerificationError naming the worst output when one is past the tolerance
    (TOLERANCE[precision]; precision read from the converted model when not given) or has a NaN/inf
    where the original has a number (or the reverse)."""
    precision = precision or _low_precision_of(converted)
    limit = dict(TOLERANCE[precision], **(tolerance or {}))
    errors, runner = compare(original, converted, feeds)
    for name, e in errors.items():
        if e.nonfinite:
            raise VerificationError(f"{precision} output '{name}' has {e.nonfinite} NaN/inf values where the fp32 "
                                    f"original has numbers (or the reverse), on {runner}")
    for name, e in sorted(errors.items(), key=lambda kv: -kv[1].rel):
        if e.rel > limit["rel"] or e.rel_l2 > limit["rel_l2"]:
            raise VerificationError(f"{precision} output '{name}' is off by {e.max_abs:.3g} ({e.rel:.3g} of its "
                                    f"largest value {e.ref_max:.3g}, relative L2 {e.rel_l2:.3g}; tolerance "
                                    f"{limit['rel']} / {limit['rel_l2']}) on {runner}")
    return errors


def _error(ref: np.ndarray, new: np.ndarray) -> OutputError:
    if ref.shape != new.shape:
        raise VerificationError(f"output shape {list(new.shape)} differs from the original's {list(ref.shape)}")
    finite = np.isfinite(ref) & np.isfinite(new)
    same_nonfinite = ~finite & ((ref == new) | (np.isnan(ref) & np.isnan(new)))
    nonfinite = int((~finite & ~same_nonfinite).sum())
    diff = np.abs(ref - new)[finite]
    ref_f = ref[finite]
    ref_max = float(np.abs(ref_f).max()) if ref_f.size else 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    return OutputError(max_abs, max_abs / max(ref_max, 1e-12),
                       float(np.linalg.norm(diff) / max(np.linalg.norm(ref_f), 1e-12)), nonfinite, ref_max)


def _low_precision_of(model: onnx.ModelProto) -> str:
    types = {i.data_type for i in model.graph.initializer} | {
        vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    return "bf16" if onnx.TensorProto.BFLOAT16 in types else "fp16"


def _input_casts(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """Float inputs the converted model takes in fp16/bf16 (keep_io_types=False)."""
    return {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input
            if i.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)}


def _ort(model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if isinstance(model, onnx.ModelProto):
        if model.ByteSize() > 2**31 - 1 - 2**24:
            raise TrtattnError("a model over 2 GB is compared from its path (pass the path, not the ModelProto)")
        source = model.SerializeToString()
    else:
        source = str(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def ort_support(model: onnx.ModelProto) -> str | None:
    """None when ONNX Runtime's CPU provider runs `model`, else its one-line reason."""
    try:
        _ort(model)
    except TrtattnError:
        raise
    except Exception as e:
        return " ".join(str(e).split())[:300]
    return None


def _cpu_runner(model: onnx.ModelProto):
    """ONNX Runtime's CPU provider, or onnx's reference evaluator where ORT has no kernel (bf16)."""
    why = ort_support(model)
    if why is None:
        session = _ort(model)
        names = [o.name for o in session.get_outputs()]
        return (lambda feeds: dict(zip(names, session.run(names, feeds))), "ONNX Runtime (CPU)")
    if "NOT_IMPLEMENTED" not in why:
        raise NotRunnableOnCpu(f"ONNX Runtime cannot load the converted model: {why}")
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(model)
    except Exception as e:
        raise NotRunnableOnCpu(f"ONNX Runtime has no CPU kernel for the converted model ({why}) and onnx's "
                               f"reference evaluator cannot run it either ({e})") from None
    names = [o.name for o in model.graph.output]

    def run(feeds):
        try:
            with np.errstate(all="ignore"):  # Cast of finfo(float32).min overflows to -inf, as in ORT
                return dict(zip(names, evaluator.run(names, feeds)))
        except Exception as e:
            raise NotRunnableOnCpu(f"ONNX Runtime has no CPU kernel for the converted model ({why}) and onnx's "
                                   f"reference evaluator failed on it: {type(e).__name__}: {e}") from None

    return run, f"onnx's reference evaluator (ONNX Runtime: {why.split(':')[-1].strip()})"
