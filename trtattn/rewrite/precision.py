"""precision: whole-model FP16 / BF16 by NVIDIA ModelOpt's AutoCast, measured and checked on CPU.

    converted = convert(model, "fp16", calibration_feeds=[feeds])
    converted.model, converted.kept_fp32    # the mixed model; {node: why it computes in fp32}
    converted.table                         # share of matmul work per dtype: {"fp16": 0.99, "fp32": 0.01}
    verify(model, converted.model, [feeds]) # VerificationError past TOLERANCE or on a NaN

TensorRT >= 11 networks are strongly typed: the ONNX dtypes are the engine's. AutoCast converts the
model and its classifier keeps in fp32 what is numerically sensitive (I/O beyond 512 in magnitude on
the calibration data: masks from finfo(float32).min, their Where/Add, the Softmax reading them;
initializers beyond fp16's range); this module never re-decides that. It adds three things AutoCast
cannot see:
- every ONNX `Attention` is forced into the low precision (`nodes_to_include`): its finfo.min mask
  would keep it fp32, while IAttention computes in its query's dtype and wants the mask in that dtype;
- fp16: that mask is clamped to finfo(float16).min in fp32 before AutoCast's Cast, which would turn
  -3.4e38 into -inf (a fully masked row is then NaN in a softmax). bf16 has fp32's range;
- rotary angles (float nodes from the positions to Sin/Cos) stay fp32: fp16 spaces values 0.03 apart
  at 32..64 and 0.25 at 256..512, under AutoCast's 512 limit (Llama at seq 400: 3.3x the error).

AutoCast 0.47 reads the model from a path (external data too), then holds all weights and deep copies
of the model while ONNX Runtime runs it over every tensor. fp16 keeps the opset (>= 13), bf16 raises
it to 22; metadata_props are dropped (restored here). Ops outside the ONNX domains are TensorRT
plugins to it (it needs TensorRT) and it moves com.microsoft ops named like ONNX ops (Attention,
RotaryEmbedding) into the ONNX domain, whose inputs differ: such models are refused, nodes named.

ONNX Runtime's CPU provider (1.32) runs the fp16 models; it has no bfloat16 kernel for MatMul, Gemm,
Conv, Add, Mul, Pow, Softmax, Attention..., so bf16 is checked on onnx's reference evaluator (numpy
over ml_dtypes' bfloat16), and compare() names the runner.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import MissingDependencyError, TrtattnError, VerificationError, require

PRECISIONS = ("fp16", "bf16")
INSTALL = "pip install 'trtattn[quant]' (NVIDIA ModelOpt without its onnxruntime-gpu)"

# Per output: "rel" bounds max |new - ref| / max |ref| (a wrong row shows), "rel_l2" ||new - ref|| / ||ref||.
# Measured on the 22 TorchScript zoo exports and their fused forms (padded feeds, seq 7-12; Llama, T5,
# Gemma 3, BART fused also at seq 32 and 60): fp16 rel 0.0007-0.0052, rel_l2 <= 0.0024; bf16 rel
# 0.012-0.10, rel_l2 <= 0.049 (T5 at seq 60 both times).
TOLERANCE = {"fp16": {"rel": 0.02, "rel_l2": 0.01}, "bf16": {"rel": 0.2, "rel_l2": 0.1}}

MATMUL_OPS = ("MatMul", "Gemm", "Conv", "Attention")
DEFAULT_DIM = 16  # a symbolic dim nobody bound
_UNCOUNTED = {"ConvTranspose", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "Einsum"}
_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
_DTYPES = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16",
           TensorProto.DOUBLE: "fp64", TensorProto.FLOAT8E4M3FN: "fp8", TensorProto.INT8: "int8",
           TensorProto.UINT8: "uint8", TensorProto.INT4: "int4", TensorProto.FLOAT4E2M1: "fp4"}
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
_NO_MATH = {"Constant", "ConstantOfShape", "Cast", "Shape", "Size", "Identity"}
_LARGE = 2**31 - 1 - 2**24  # protobuf's limit, with room


class PrecisionError(TrtattnError):
    """AutoCast could not convert the model, or its matmul work cannot be counted."""


class NotRunnableOnCpu(TrtattnError):
    """Neither ONNX Runtime's CPU provider nor onnx's reference evaluator runs the model."""


@dataclass
class Converted:
    model: onnx.ModelProto
    precision: str
    kept_fp32: dict[str, str]  # node -> why it computes in fp32 (AutoCast's log, or this module's rule)
    table: dict[str, float]  # share of matmul work per dtype, at the first calibration feed's shapes
    log: str = field(default="", repr=False)  # AutoCast's log, for --debug


# ---------------------------------------------------------------- conversion
def convert(model: onnx.ModelProto | str | os.PathLike, precision: str, *, keep_io_types: bool = True,
            keep_fp32: Sequence[str] = (), calibration_feeds: Mapping | Sequence[Mapping] | None = None) -> Converted:
    """`model` (a ModelProto, not modified, or a path: only its graph is loaded here) in fp16 or bf16.
    keep_fp32: node names that stay fp32. calibration_feeds: a feed dict or a list of them, AutoCast's
    classifier reads every tensor's range on them (None: AutoCast's own uniform [-1, 1] inputs with
    dynamic dims 1, which say little about masks); the table is counted at the first one's shapes."""
    if precision not in PRECISIONS:
        raise TrtattnError(f"unknown precision '{precision}'; choose one of: {', '.join(PRECISIONS)}")
    autocast = _autocast()
    feeds = [calibration_feeds] if isinstance(calibration_feeds, Mapping) else list(calibration_feeds or [])
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trtattn-autocast-")))
        if isinstance(model, onnx.ModelProto):
            work, src_dir = copy.deepcopy(model), None
        elif Path(model).is_file():
            work, src_dir = onnx.load(str(model), load_external_data=False), Path(model).parent
        else:
            raise TrtattnError(f"{model}: no such model file")
        _refuse_foreign_ops(work)
        _name_nodes(work)
        missing = sorted(set(keep_fp32) - {n.name for n in work.graph.node})
        if missing:
            raise TrtattnError(f"keep_fp32 names no node of the model: {', '.join(missing)}")
        types = _infer(work)[0]
        ours = {n: "asked (keep_fp32)" for n in keep_fp32}
        for n in _rotary_angles(work, types):
            ours[n] = "rotary angle: fp16/bf16 cannot hold position x frequency"
        if precision == "fp16":
            for n in _clamp_masks(work, types):
                ours[n] = "clamps an attention mask to fp16's range before its Cast"
        attentions = [n.name for n in work.graph.node if n.op_type == "Attention" and n.domain in _ONNX_DOMAINS]
        props = list(work.metadata_props)
        path = _stage(work, tmp, src_dir, stack)
        # counted on the fp32 model, which ONNX Runtime runs if the shapes need a run (bf16 it cannot)
        external = any(i.data_location == TensorProto.EXTERNAL for i in work.graph.initializer)
        work_done = _work(work, feeds[0] if feeds else None, None, None, path.parent if external else None)
        del work
        calib = tmp / "calibration"
        for i, f in enumerate(feeds):  # one .npz per batch: AutoCast aggregates the ranges
            calib.mkdir(exist_ok=True)
            np.savez(calib / f"{i:04d}.npz", **{k: np.asarray(v) for k, v in f.items()})
        log = io.StringIO()
        try:
            with _captured(log):
                out = autocast.convert_to_mixed_precision(
                    str(path), low_precision_type=precision, keep_io_types=keep_io_types,
                    nodes_to_exclude=[re.escape(n) + "$" for n in sorted(ours)],
                    nodes_to_include=[re.escape(n) + "$" for n in attentions] or None,
                    calibration_data=str(calib) if feeds else None, providers=["cpu"])
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            error = PrecisionError(f"AutoCast {precision} conversion failed: {type(e).__name__}: {first}")
            error.log = log.getvalue()
            raise error from None
    if not out.metadata_props:
        out.metadata_props.extend(props)
    dtypes = {w.node: w.dtype for w in _dtypes(out)}
    table = _shares([dataclasses.replace(w, dtype=dtypes.get(w.node, w.dtype)) for w in work_done])
    return Converted(out, precision, _kept_fp32(out, log.getvalue(), ours), table, log.getvalue())


def _autocast():
    """modelopt.onnx.autocast, imported lazily and quietly (it imports torch: seconds)."""
    with _captured(io.StringIO()):
        try:
            return require("modelopt.onnx.autocast", "fp16/bf16 conversion (NVIDIA ModelOpt's AutoCast)", INSTALL)
        except MissingDependencyError:
            raise
        except Exception as e:  # ModelOpt is there but its ONNX side cannot import
            raise MissingDependencyError(f"fp16/bf16 conversion needs NVIDIA ModelOpt's AutoCast ({e}); "
                                         f"install it with: {INSTALL}") from None


def _stage(work: onnx.ModelProto, tmp: Path, src_dir: Path | None, stack: contextlib.ExitStack) -> Path:
    """The file AutoCast reads. A model loaded from a path keeps its weights where they are: the copy
    is written beside the original under a hidden name and removed afterwards (onnx refuses external
    data reached through a symbolic or hard link)."""
    if src_dir is None:
        path, large = tmp / "model.onnx", work.ByteSize() > _LARGE
        onnx.save_model(work, str(path), save_as_external_data=large, all_tensors_to_one_file=True,
                        location="model.onnx.data" if large else None)
        return path
    path = src_dir / f".trtattn-autocast-{tmp.name}.onnx"
    stack.callback(path.unlink, missing_ok=True)
    try:
        onnx.save_model(work, str(path))
    except OSError as e:
        raise TrtattnError(f"cannot write AutoCast's copy of the model beside its weights ({e}): "
                           "pass the model loaded (a ModelProto) instead") from None
    return path


def _refuse_foreign_ops(model: onnx.ModelProto) -> None:
    foreign = [f"{n.name or n.op_type} ({n.domain}:{n.op_type})" for n in model.graph.node
               if n.domain not in _ONNX_DOMAINS]
    if foreign:
        raise PrecisionError(
            f"AutoCast cannot convert ops outside the ONNX domain: {', '.join(foreign[:6])}"
            f"{' ...' if len(foreign) > 6 else ''}. It reads them as TensorRT plugins (it needs TensorRT for that) "
            "and moves com.microsoft ops named like an ONNX op (Attention, RotaryEmbedding) into the ONNX domain, "
            "whose inputs differ; convert them to standard ONNX ops first (trtattn fuse)")


def _name_nodes(model: onnx.ModelProto) -> None:
    """A unique name for every node: AutoCast's rules and its log go by name."""
    used: set[str] = set()
    for i, n in enumerate(model.graph.node):
        base, k = n.name or f"trtattn/{n.op_type}_{i}", 0
        while n.name in used or not n.name:
            n.name, k = f"{base}_{k}", k + 1
        used.add(n.name)


def _clamp_masks(model: onnx.ModelProto, types: dict[str, int]) -> list[str]:
    """Max(mask, finfo(fp16).min) in fp32 on every float attn_mask of an Attention: the nodes added."""
    clamped: dict[str, str] = {}
    floor, position = "trtattn/fp16_mask_floor", 0
    while position < len(model.graph.node):
        node = model.graph.node[position]
        mask = node.input[3] if node.op_type == "Attention" and len(node.input) > 3 else ""
        if mask and types.get(mask) == TensorProto.FLOAT:
            if mask not in clamped:
                clamped[mask] = f"{mask}/fp16_clamped"
                model.graph.node.insert(position, onnx.helper.make_node(
                    "Max", [mask, floor], [clamped[mask]], name=f"{node.name}/fp16_mask_clamp"))
                position += 1
            node.input[3] = clamped[mask]
        position += 1
    if clamped:
        lowest = np.array(np.finfo(np.float16).min, np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(lowest, floor))
    return [n.name for n in model.graph.node if n.name.endswith("/fp16_mask_clamp")]


def _rotary_angles(model: onnx.ModelProto, types: dict[str, int]) -> list[str]:
    """Sin/Cos of angles computed from positions alone, and the float nodes computing the angles.
    "From positions alone": from weights, constants and integer tensors only; a Sin/Cos of an
    activation is no rotary angle and is left to AutoCast."""
    derived = {i.name for i in model.graph.initializer} | {t for t, ty in types.items() if ty not in _FLOATS}
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
        frontier += [producer[t] for t in node.input if t in producer and t in derived and types.get(t) in _FLOATS]
    return keep


def _kept_fp32(model: onnx.ModelProto, log: str, ours: dict[str, str]) -> dict[str, str]:
    """Every node computing in fp32 in the converted model, with the reason AutoCast logged or ours."""
    skipped = re.finditer(r"Skipping node (.+?): (.+)$", log, re.M)  # the first rule that matched
    reasons = {m.group(1): m.group(2).strip() for m in reversed(list(skipped))}
    unsupported = re.search(r"ops are not supported in '(\w+)' in opset (\d+).*?(\{.*\})", log)
    types = _declared_types(model)
    kept = {}
    for n in model.graph.node:
        if n.op_type in _NO_MATH or TensorProto.FLOAT not in {types.get(t) for t in [*n.input, *n.output] if t}:
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
    root.handlers[:], autocast.handlers[:], autocast.propagate = [handler], [], True
    autocast.setLevel(logging.INFO)
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
    dtype it runs in, largest first; counted at the shapes matmul_work explains."""
    return _shares(matmul_work(model, feeds, shapes=shapes, dims=dims))


def matmul_work(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None, *,
                shapes: Mapping[str, Sequence[int]] | None = None, dims: Mapping[str, int] | None = None) -> list[Work]:
    """One Work per matmul node: its multiply-accumulates and its dtype (its first input's, or the
    quantized type behind a DequantizeLinear).

    The inputs take the shapes of `feeds`, else `shapes` (a profile's opt shapes), else their symbolic
    dims take `dims`, else DEFAULT_DIM; ONNX's shape inference carries them through the graph. Where
    it loses a dim (RoPE's Slice at x.shape[-1] // 2, a broadcast against batch 1) the model is run
    on `feeds` for the exact shapes; without feeds that is an error naming the tensor."""
    return _work(model, feeds, shapes, dims)


def _work(model, feeds, shapes, dims, weights_dir: Path | None = None) -> list[Work]:
    """matmul_work; weights_dir: where the external data of a model loaded without it lives."""
    nodes = _matmul_nodes(model)
    if feeds is not None:
        shapes = {k: np.shape(v) for k, v in feeds.items()}
    types, static = _infer(model, shapes, dims)
    missing = sorted({t for n in nodes for t in _shaped(n) if t not in static})
    if missing and feeds is not None:
        static.update(_run_shapes(model, missing, feeds, weights_dir))
    for n in nodes:
        for t in _shaped(n):
            if t not in static:
                raise PrecisionError(f"no static shape for '{t}' ({n.op_type} {n.name}) from ONNX's shape "
                                     "inference: pass feeds to count it from a run")
    producer = {o: n for n in model.graph.node for o in n.output}
    return [Work(n.name, n.op_type, _dtype_of(n.input[0], types, producer), _macs(n, static)) for n in nodes]


def _shares(work: list[Work]) -> dict[str, float]:
    totals: dict[str, int] = {}
    for w in work:
        totals[w.dtype] = totals.get(w.dtype, 0) + w.macs
    total = sum(totals.values())
    return {k: v / total for k, v in sorted(totals.items(), key=lambda kv: -kv[1])} if total else {}


def _dtypes(model: onnx.ModelProto) -> list[Work]:
    """The dtype of each matmul node from the types the model declares (AutoCast writes them all)."""
    types, producer = _declared_types(model), {o: n for n in model.graph.node for o in n.output}
    return [Work(n.name, n.op_type, _dtype_of(n.input[0], types, producer), 0) for n in _matmul_nodes(model)]


def _matmul_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = []
    for n in model.graph.node:
        counted = n.domain in _ONNX_DOMAINS and n.op_type in MATMUL_OPS
        if not counted and (n.op_type in _UNCOUNTED or n.op_type in MATMUL_OPS or "Attention" in n.op_type
                            or "MatMul" in n.op_type):
            raise PrecisionError(f"precision_table cannot count the matmul work of {n.domain or 'ai.onnx'}:"
                                 f"{n.op_type} (node {n.name}); convert it to standard ONNX ops first")
        if counted:
            nodes.append(n)
    return nodes


def _shaped(n: onnx.NodeProto) -> list[str]:
    """The tensors whose shapes give a matmul node's work."""
    if n.op_type == "Conv":
        return [n.input[1], n.output[0]]
    if n.op_type == "Attention":  # Q, K, V, past_key
        return [t for i, t in enumerate(n.input[:5]) if t and i != 3]
    return list(n.input[:2])


def _macs(n: onnx.NodeProto, static: dict[str, list[int]]) -> int:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    a, b = static[n.input[0]], static[n.input[1]]
    if n.op_type == "MatMul":
        batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        return int(np.prod(batch, dtype=np.int64)) * (a[-2] if len(a) > 1 else 1) * a[-1] * (b[-1] if len(b) > 1 else 1)
    if n.op_type == "Gemm":
        m, k = (a[1], a[0]) if attrs.get("transA") else (a[0], a[1])
        return m * k * (b[0] if attrs.get("transB") else b[1])
    if n.op_type == "Conv":  # every output element: in_channels / group x kernel volume
        return int(np.prod(static[n.output[0]], dtype=np.int64)) * int(np.prod(b[1:], dtype=np.int64))
    # Attention: Q [B, Nq, Sq, H] or [B, Sq, Nq*H]; K, V likewise with Nkv; a past_key adds to Skv
    v = static[n.input[2]]
    if len(a) == 4:
        (batch, heads, sq, head), skv, head_v = a, b[2], v[3]
    elif attrs.get("q_num_heads") and attrs.get("kv_num_heads"):
        heads = attrs["q_num_heads"]
        batch, sq, head, skv, head_v = a[0], a[1], a[2] // heads, b[1], v[2] // attrs["kv_num_heads"]
    else:
        raise PrecisionError(f"Attention {n.name} has 3-D inputs but no q_num_heads/kv_num_heads")
    if len(n.input) > 4 and n.input[4]:
        skv += static[n.input[4]][2]
    return batch * heads * sq * skv * (head + head_v)


def _dtype_of(tensor: str, types: dict[str, int], producer) -> str:
    p, hops = producer.get(tensor), 0
    while p is not None and p.op_type in ("Transpose", "Reshape") and hops < 4:
        p, hops = producer.get(p.input[0]), hops + 1
    if p is not None and p.op_type == "DequantizeLinear":
        tensor = p.input[0]
    return _DTYPES.get(types.get(tensor, 0), "unknown")


def _declared_types(model: onnx.ModelProto) -> dict[str, int]:
    types = {i.name: i.data_type for i in model.graph.initializer}
    for vi in [*model.graph.value_info, *model.graph.input, *model.graph.output]:
        types[vi.name] = vi.type.tensor_type.elem_type
    return types


def _infer(model: onnx.ModelProto, shapes: Mapping | None = None, dims: Mapping | None = None) -> tuple[dict, dict]:
    """Elem types and fully static shapes from ONNX's inference (data propagation on), run on the
    model's structure (no weight bytes; small initializers keep their values: Reshape targets) with
    every graph input bound to a static shape."""
    view = onnx.ModelProto(ir_version=model.ir_version)
    view.opset_import.extend(model.opset_import)
    view.functions.extend(model.functions)
    g = model.graph
    view.graph.node.extend(g.node)
    view.graph.input.extend(g.input)
    view.graph.output.extend(g.output)  # value_info is left out: inference starts from the inputs
    for init in g.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= 1024 and init.data_location != TensorProto.EXTERNAL:
            view.graph.initializer.append(init)
        else:
            stub = view.graph.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims,
                                              data_location=TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="trtattn-weightless")
    inits, shapes, dims = {i.name for i in g.initializer}, shapes or {}, dims or {}
    for vi in view.graph.input:
        given, dim_list = shapes.get(vi.name), vi.type.tensor_type.shape.dim
        if vi.name in inits:
            continue
        if given is not None and len(given) != len(dim_list):
            raise PrecisionError(f"shape {list(given)} for input '{vi.name}': rank {len(given)}, not {len(dim_list)}")
        for i, d in enumerate(dim_list):
            bound = d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, DEFAULT_DIM)
            value = given[i] if given is not None else bound
            d.Clear()
            d.dim_value = int(value)
    try:
        inferred = onnx.shape_inference.infer_shapes(view, data_prop=True)
    except Exception as e:
        raise PrecisionError(f"ONNX shape inference failed: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
    types = {i.name: i.data_type for i in g.initializer}
    static = {i.name: list(i.dims) for i in g.initializer}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tt = vi.type.tensor_type
        types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            static[vi.name] = [d.dim_value for d in tt.shape.dim]
    return types, static


def _run_shapes(model: onnx.ModelProto, names: list[str], feeds, weights_dir: Path | None) -> dict[str, list[int]]:
    """The shapes of `names` in a run of the model on `feeds` (from weights_dir when it has one)."""
    probe = copy.deepcopy(model)
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in outputs)
    if weights_dir is None:
        run, _ = cpu_runner(probe)
        return {t: list(np.shape(v)) for t, v in run(feeds).items() if t in names}
    path = weights_dir / f".trtattn-shape-probe-{os.getpid()}.onnx"  # beside the weights it refers to
    try:
        onnx.save_model(probe, str(path))
        run, _ = cpu_runner(path)
        return {t: list(np.shape(v)) for t, v in run(feeds).items() if t in names}
    finally:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- checking on CPU
@dataclass
class OutputError:
    max_abs: float  # over the elements finite in both
    rel: float  # max_abs / max |reference|
    rel_l2: float  # ||new - ref|| / ||ref||
    nonfinite: int  # elements NaN/inf in one model and not the same in the other
    ref_max: float


def compare(original: onnx.ModelProto | str | os.PathLike, converted: onnx.ModelProto,
            feeds: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, OutputError], str]:
    """Every float output of `converted` against `original` (fp32 on ONNX Runtime CPU) over `feeds`,
    the worst per output; and what ran the converted model."""
    reference, _ = cpu_runner(original)
    candidate, runner = cpu_runner(converted)
    errors: dict[str, OutputError] = {}
    for f in feeds:
        want, got = reference(f), candidate(f)
        for name, ref in want.items():
            if name not in got:
                raise VerificationError(f"the converted model has no output '{name}'")
            if np.issubdtype(np.asarray(ref).dtype, np.floating):
                e, old = _error(np.asarray(ref, np.float64), np.asarray(got[name]).astype(np.float64)), errors.get(name)
                errors[name] = e if old is None else OutputError(
                    max(old.max_abs, e.max_abs), max(old.rel, e.rel), max(old.rel_l2, e.rel_l2),
                    old.nonfinite + e.nonfinite, max(old.ref_max, e.ref_max))
    return errors, runner


def verify(original: onnx.ModelProto | str | os.PathLike, converted: onnx.ModelProto,
           feeds: Sequence[Mapping[str, np.ndarray]], *, precision: str | None = None,
           tolerance: Mapping[str, float] | None = None) -> dict[str, OutputError]:
    """compare(), then a VerificationError naming the output with a NaN/inf where the original has a
    number (or the reverse), or the worst output past TOLERANCE[precision] (updated by `tolerance`)."""
    if precision is None:
        types = {i.data_type for i in converted.graph.initializer}
        precision = "bf16" if TensorProto.BFLOAT16 in types | set(_declared_types(converted).values()) else "fp16"
    limit = {**TOLERANCE[precision], **(tolerance or {})}
    errors, runner = compare(original, converted, feeds)
    for name, e in sorted(errors.items(), key=lambda kv: (-kv[1].nonfinite, -kv[1].rel)):
        if e.nonfinite:
            raise VerificationError(f"{precision} output '{name}' has {e.nonfinite} NaN/inf values where the fp32 "
                                    f"original has numbers (or the reverse), on {runner}")
        if e.rel > limit["rel"] or e.rel_l2 > limit["rel_l2"]:
            raise VerificationError(f"{precision} output '{name}' is off by {e.max_abs:.3g} ({e.rel:.3g} of its "
                                    f"largest value {e.ref_max:.3g}, relative L2 {e.rel_l2:.3g}; tolerance "
                                    f"{limit['rel']} / {limit['rel_l2']}) on {runner}")
    return errors


def _error(ref: np.ndarray, new: np.ndarray) -> OutputError:
    if ref.shape != new.shape:
        raise VerificationError(f"output shape {list(new.shape)} differs from the original's {list(ref.shape)}")
    finite = np.isfinite(ref) & np.isfinite(new)
    same = (ref == new) | (np.isnan(ref) & np.isnan(new))  # inf == inf, NaN where the original has NaN
    diff, ref_f = np.abs(ref - new)[finite], ref[finite]
    ref_max = float(np.abs(ref_f).max()) if ref_f.size else 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    rel_l2 = float(np.linalg.norm(diff) / max(np.linalg.norm(ref_f), 1e-12))
    return OutputError(max_abs, max_abs / max(ref_max, 1e-12), rel_l2, int((~finite & ~same).sum()), ref_max)


def ort_support(model: onnx.ModelProto | str | os.PathLike) -> str | None:
    """None when ONNX Runtime's CPU provider can run `model`, else its one-line reason."""
    try:
        _session(model)
    except Exception as e:
        return " ".join(str(e).split())[:300]
    return None


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if isinstance(model, onnx.ModelProto) and model.ByteSize() > _LARGE:
        raise TrtattnError("a model over 2 GB runs from its path: pass the path, not the ModelProto")
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def cpu_runner(model: onnx.ModelProto | str | os.PathLike):
    """(run(feeds) -> {output: array}, what runs it): ONNX Runtime's CPU provider, or onnx's reference
    evaluator where ORT has no kernel (bf16). Float inputs the model takes in fp16/bf16 are cast."""
    try:
        session = _session(model)
    except TrtattnError:
        raise
    except Exception as e:
        why = " ".join(str(e).split())[:300]
        if "NOT_IMPLEMENTED" not in why or not isinstance(model, onnx.ModelProto):
            raise NotRunnableOnCpu(f"ONNX Runtime cannot load the model: {why}") from None
        return _reference_runner(model, why)
    names = [o.name for o in session.get_outputs()]
    casts = {i.name: np.float16 for i in session.get_inputs() if i.type == "tensor(float16)"}
    return (lambda feeds: dict(zip(names, session.run(names, _cast(feeds, casts)))), "ONNX Runtime (CPU)")


def _reference_runner(model: onnx.ModelProto, why: str):
    from onnx.reference import ReferenceEvaluator

    failed = (f"ONNX Runtime has no CPU kernel for the model ({why}) and onnx's reference evaluator "
              "failed on it")
    try:
        evaluator = ReferenceEvaluator(model)
    except Exception as e:
        raise NotRunnableOnCpu(f"{failed}: {type(e).__name__}: {e}") from None
    names = [o.name for o in model.graph.output]
    casts = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input
             if i.type.tensor_type.elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)}

    def run(feeds):
        try:
            with np.errstate(all="ignore"):  # a Cast of finfo(float32).min overflows to -inf, as on ORT
                return dict(zip(names, evaluator.run(names, _cast(feeds, casts))))
        except Exception as e:
            raise NotRunnableOnCpu(f"{failed}: {type(e).__name__}: {e}") from None

    return run, f"onnx's reference evaluator (ONNX Runtime: {why.split(':')[-1].strip()})"


def _cast(feeds: Mapping[str, np.ndarray], casts: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    return {k: (np.asarray(v).astype(casts[k]) if k in casts else v) for k, v in feeds.items()}
