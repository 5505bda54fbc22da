"""quantize: FP8 / INT8 post-training quantization by NVIDIA ModelOpt, checked site by site.

    result = quantize(model, "fp8", load_calibration("calib.npz"))
    result.model            # Q/DQ model (ModelOpt's explicit quantization, opset >= 19)
    result.sites            # one SiteQuant per attention: its Q/DQ scales, or why there are none

ModelOpt's ONNX PTQ (`modelopt.onnx.quantization.quantize`) places the Q/DQ and calibrates, on
CPU (ONNX Runtime's CPUExecutionProvider); this module never places Q/DQ itself. TensorRT fuses
a quantized attention when Q/DQ pairs sit on both inputs of both attention MatMuls, BMM1 (Q, K)
and BMM2 (the Softmax output, V), and nothing between BMM1 and the Softmax is quantized; the pair
on the Softmax output is IAttention's normalization quantize scale. ModelOpt is configured for
that pattern:

- selection "gemm" (default): ModelOpt quantizes every MatMul, Gemm and Conv, the attention
  MatMuls included. ModelOpt's default placement ("modelopt") also quantizes Add/Mul/norm inputs
  and treats MatMul -> Add(non-constant mask) -> Softmax -> MatMul (trtattn's normalised form, Swin,
  T5 with SDPA) as a non-quantizable partition, although its own FP8 fMHA pattern accepts it;
- the logit ops of every site (scale, mask, bias between BMM1 and the Softmax) are excluded:
  ModelOpt's Add rule would otherwise quantize the mask Add, whose finfo.min entries overflow an
  fp16 scale into inf (NaN outputs) and push the logits to zero.

ModelOpt's own rules still apply, and a site they leave without the full pattern is reported with
the rule (read from ModelOpt's debug log and its pattern functions), never patched by hand:

- a small or vector GEMM at the calibration shapes (M or N == 1, or K or N < 16): ModelOpt skips
  such MatMuls for TensorRT performance, so calibrate at realistic sequence lengths (>= 16);
  a one-token decode step (query length 1) is a GEMV and is never quantized;
- INT8: a key length > 512 (TensorRT's INT8 fused attention limit);
- FP8: a head size outside 9..256, or an attention ModelOpt recognises as MHA that is not NVIDIA's
  FP8 fMHA v2 pattern (MatMul -> [Mul|Div] -> [Add] -> Softmax -> MatMul with only Reshape,
  Transpose, Flatten, Cast between; T5's bias Add + mask Add is not: normalise first).

Calibration data: a dict (or an .npz file) of arrays keyed by model input name, in ModelOpt's
convention: the samples concatenated along axis 0 (the batch axis), so N samples of a model with a
dynamic batch are N calibration steps of batch 1 (a static batch b takes N / b steps).

Precision: high_precision_dtype "fp16" (ModelOpt's default, what TensorRT runs around FP8/INT8
attention) converts the rest of the model to fp16; a mask built from finfo(float32).min then holds
-inf, so a fully masked row (a padding query) gives NaN on ONNX Runtime. Verify with inputs
without padding, or quantize with "fp32".

FP8 on CPU: ONNX Runtime runs QuantizeLinear/DequantizeLinear with float8e4m3fn (opset >= 19), but
its extended graph optimisations fuse DequantizeLinear -> MatMul into MatMulIntegerToFloat, which
rejects float8: `session` and `compare` use the basic optimisation level.
"""

from __future__ import annotations

import ast
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

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import MissingDependencyError, TrtattnError
from ..site import AttentionSite

MODES = ("fp8", "int8")
QDQ_DTYPES = {"fp8": "float8e4m3fn", "int8": "int8"}
HIGH_PRECISION = ("fp32", "fp16", "bf16")
SELECTIONS = ("gemm", "modelopt")
GEMM_OPS = ("MatMul", "Gemm", "Conv")
INSTALL = "pip install 'trtattn[quant]' (NVIDIA ModelOpt without its onnxruntime-gpu)"

# Tolerance of a quantized model against the fp32 original on ONNX Runtime CPU: the relative L2
# error of every output, ||q - ref|| / ||ref|| (max abs errors scale with each model's activations).
# Measured on the 22 TorchScript zoo exports (4 max-calibrated samples at seq 32, fp16 elsewhere,
# inputs without padding): INT8 0.022-0.085, FP8 (3 mantissa bits) 0.059-0.145, T5 up to 0.26.
REL_TOLERANCE = {"int8": 0.15, "fp8": 0.3}

# Ops that may sit between a Q/DQ pair and the attention MatMul it feeds (ModelOpt's accumulation
# casts) and between the Softmax and the Q of its output.
_BETWEEN = {"Cast", "Identity"}
_LAYOUT = {"Cast", "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"}


# Columns for trtattn.report.table(result.summary()["sites"], QUANT_COLUMNS).
QUANT_COLUMNS = [("name", "site"), ("placed", "Q/DQ"), ("qdq_dtype", "type"), ("q_scale", "q scale"),
                 ("k_scale", "k scale"), ("softmax_scale", "softmax scale"), ("v_scale", "v scale"),
                 ("reason", "why not")]


class CalibrationError(TrtattnError):
    """The calibration data does not fit the model."""


class QuantizationError(TrtattnError):
    """ModelOpt failed on the model."""


@dataclass
class SiteQuant:
    """What quantization did to one attention.

    q_scale, k_scale: scales of the Q/DQ pairs on BMM1's inputs; softmax_scale: of the pair on the
    Softmax output (BMM2's first input: IAttention's normalization quantize scale); v_scale: of
    the pair on BMM2's second input; output_scale: a Q/DQ on the attention output, if ModelOpt put
    one there (it is optional for TensorRT). Scales are QuantizeLinear's: x_q = x / scale.
    """

    site: str
    placed: bool
    reason: str = ""
    q_scale: float | None = None
    k_scale: float | None = None
    softmax_scale: float | None = None
    v_scale: float | None = None
    output_scale: float | None = None
    qdq_dtype: str | None = None
    bmm1: str | None = None
    bmm2: str | None = None
    softmax: str | None = None

    def row(self) -> dict:
        return {"name": self.site, "placed": self.placed, "reason": self.reason, "q_scale": self.q_scale,
                "k_scale": self.k_scale, "softmax_scale": self.softmax_scale, "v_scale": self.v_scale,
                "output_scale": self.output_scale, "qdq_dtype": self.qdq_dtype, "bmm1": self.bmm1,
                "bmm2": self.bmm2, "softmax": self.softmax}


@dataclass
class QuantizeResult:
    model: onnx.ModelProto
    mode: str
    sites: list[SiteQuant] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # what ModelOpt was asked to do
    log: str = ""  # ModelOpt's (debug) log of the run

    @property
    def ok(self) -> bool:
        """Every attention carries the Q/DQ pattern TensorRT fuses."""
        return all(s.placed for s in self.sites)

    def summary(self) -> dict:
        return {"mode": self.mode, **self.settings, "sites": [s.row() for s in self.sites],
                "placed": sum(s.placed for s in self.sites), "total": len(self.sites)}


# ---------------------------------------------------------------- calibration data
def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def load_calibration(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Arrays of an .npz file, keyed by name (no pickles)."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"{path}: no such calibration file")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as e:
        raise CalibrationError(f"{path}: not a readable .npz file ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else 'cannot read'})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise CalibrationError(f"{path}: a single array (.npy), not an .npz of arrays keyed by model input name")
    try:
        return {k: data[k] for k in data.files}
    except Exception as e:
        raise CalibrationError(f"{path}: not a readable .npz file ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else 'cannot read'})") from None
    finally:
        data.close()


def check_calibration(model: onnx.ModelProto, calib: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The calibration arrays, checked against the model's inputs and cast to their dtypes.

    Raises CalibrationError (one sentence) when keys, ranks, static dims, dtypes or sample counts
    do not fit."""
    if not isinstance(calib, dict) or not calib:
        raise CalibrationError("calibration data must be a non-empty dict of arrays keyed by model input name")
    inputs = model_inputs(model)
    names = [i.name for i in inputs]
    missing = [n for n in names if n not in calib]
    extra = [k for k in calib if k not in names]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unknown {', '.join(map(str, extra))}")
        raise CalibrationError(f"calibration data keys do not match the model inputs ({'; '.join(parts)}); "
                               f"expected exactly: {', '.join(names)}")
    out, counts = {}, {}
    for vi in inputs:
        arr = np.asarray(calib[vi.name])
        tt = vi.type.tensor_type
        want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if tt.HasField("shape") and arr.ndim != len(dims):
            raise CalibrationError(f"calibration array '{vi.name}' has rank {arr.ndim} ({_shape(arr)}); "
                                   f"the model input has rank {len(dims)} ({_shape_of(tt)})")
        for axis, d in enumerate(dims):
            if axis and d is not None and arr.shape[axis] != d:
                raise CalibrationError(f"calibration array '{vi.name}' has shape {_shape(arr)}; "
                                       f"the model input is {_shape_of(tt)} (axis {axis} must be {d})")
        if arr.dtype != want:
            if _kind(arr.dtype) != _kind(want):
                raise CalibrationError(f"calibration array '{vi.name}' is {arr.dtype}; the model input is {want}")
            arr = arr.astype(want)
        if arr.ndim == 0 or arr.shape[0] == 0:
            raise CalibrationError(f"calibration array '{vi.name}' has no samples (shape {_shape(arr)})")
        batch = dims[0] if dims else None
        if batch and arr.shape[0] % batch:
            raise CalibrationError(f"calibration array '{vi.name}' has {arr.shape[0]} rows along axis 0, "
                                   f"not a multiple of the model's static batch {batch}")
        counts[vi.name] = arr.shape[0] // (batch or 1)
        out[vi.name] = arr
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise CalibrationError(f"calibration arrays hold different numbers of samples along axis 0 ({detail}); "
                               "each must hold its samples concatenated along axis 0 (ModelOpt's convention)")
    return out


def stack_feeds(feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Feed dicts (e.g. trtattn.inputs.make_feeds with several seeds) -> ModelOpt's calibration dict."""
    return {k: np.concatenate([f[k] for f in feeds], axis=0) for k in feeds[0]}


def _kind(dt: np.dtype) -> str:
    return "bool" if dt == np.bool_ else ("int" if dt.kind in "iu" else ("float" if dt.kind == "f" else dt.kind))


def _shape(arr: np.ndarray) -> str:
    return "x".join(map(str, arr.shape)) or "scalar"


def _shape_of(tt) -> str:
    return "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)


# ---------------------------------------------------------------- quantization
def quantize(model: onnx.ModelProto, mode: str, calib: dict[str, np.ndarray], sites: list[AttentionSite] | None = None,
             *, calibration_method: str | None = None, high_precision_dtype: str = "fp16",
             mha_accumulation_dtype: str = "fp16", selection: str = "gemm",
             workdir: str | os.PathLike | None = None, extra_options: dict | None = None) -> QuantizeResult:
    """Quantize `model` (not modified) with ModelOpt and report each attention site's Q/DQ.

    mode: "fp8" or "int8". calib: arrays keyed by input name (see check_calibration).
    sites: the attention sites of `model` (default: trtattn.match(model)); pattern sites only.
    calibration_method: "max" or "entropy"; default "max" for fp8 (ModelOpt derives FP8 scales
    from max-calibrated INT8 ones) and "entropy" for int8 (ModelOpt's default).
    high_precision_dtype: precision of everything not quantized ("fp16": ModelOpt's default and
    what TensorRT's FP8/INT8 fused attention runs with; "fp32" keeps the rest fp32).
    selection: which nodes ModelOpt is asked to quantize. "gemm" (default): every MatMul, Gemm and
    Conv, the attention MatMuls included; ModelOpt's own exclusion rules still apply (small/GEMV
    GEMMs, INT8 key length > 512, FP8 head size and fMHA pattern, its Conv rules). "modelopt":
    ModelOpt's default placement heuristics, which also quantize Add/Mul/normalisation inputs and
    leave MatMul -> Add(mask) -> Softmax -> MatMul attentions unquantized.
    extra_options: further keyword arguments for modelopt.onnx.quantization.quantize.
    """
    if mode not in MODES:
        raise TrtattnError(f"unknown quantization mode '{mode}'; choose one of: {', '.join(MODES)}")
    if high_precision_dtype not in HIGH_PRECISION:
        raise TrtattnError(f"unknown high-precision dtype '{high_precision_dtype}'; "
                           f"choose one of: {', '.join(HIGH_PRECISION)}")
    method = calibration_method or ("max" if mode == "fp8" else "entropy")
    if selection not in SELECTIONS:
        raise TrtattnError(f"unknown node selection '{selection}'; choose one of: {', '.join(SELECTIONS)}")
    if method not in ("max", "entropy"):
        raise TrtattnError(f"unknown calibration method '{method}'; choose max or entropy")
    calib = check_calibration(model, calib)
    _modelopt()  # fail early, before any work, when ModelOpt is missing

    named = _named_copy(model)
    if sites is None:
        from ..match import match

        sites = match(named).sites
    cores = _cores(named, sites)

    # The ops between BMM1 and the Softmax (scale, mask) stay in high precision: TensorRT's fused
    # attention pattern has no Q/DQ there, and ModelOpt's Add rule would otherwise quantize a mask
    # Add (whose -inf-like values make its scale overflow).
    options = dict(extra_options or {})
    keep = sorted({n for c in cores for n in c.logit_ops})
    options["nodes_to_exclude"] = list(options.get("nodes_to_exclude") or []) + [re.escape(n) + "$" for n in keep]
    if selection == "gemm" and "nodes_to_quantize" not in options:
        options["op_types_to_quantize"] = list(options.get("op_types_to_quantize") or GEMM_OPS)
        gemms = [n.name for n in named.graph.node if n.op_type in options["op_types_to_quantize"]]
        options["nodes_to_quantize"] = [re.escape(n) + "$" for n in gemms] or None
    settings = {"quantize_mode": mode, "calibration_method": method, "calibration_eps": ["cpu"],
                "high_precision_dtype": high_precision_dtype, "mha_accumulation_dtype": mha_accumulation_dtype,
                "selection": selection, "calibration_samples": next(iter(calib.values())).shape[0],
                "excluded_logit_ops": keep, **(extra_options or {})}
    with contextlib.ExitStack() as stack:
        tmp = Path(workdir) if workdir else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="trtattn-quant-")))
        src, dst = tmp / "model.onnx", tmp / f"model.{mode}.onnx"
        large = _large(named)
        onnx.save_model(named, str(src), save_as_external_data=large, all_tensors_to_one_file=True,
                        location="model.onnx.data" if large else None)
        log = io.StringIO()
        try:
            with _captured_log(log):
                _modelopt().quantize(
                    str(src), quantize_mode=mode, calibration_data=calib, calibration_method=method,
                    calibration_eps=["cpu"], output_path=str(dst), high_precision_dtype=high_precision_dtype,
                    mha_accumulation_dtype=mha_accumulation_dtype, use_external_data_format=large,
                    log_level="DEBUG", **options)
        except TrtattnError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            error = QuantizationError(f"ModelOpt {mode} quantization failed: {type(e).__name__}: {first}")
            error.log = log.getvalue()  # ModelOpt's debug log, for --debug
            raise error from None
        if not dst.exists():
            error = QuantizationError(f"ModelOpt {mode} quantization wrote no model")
            error.log = log.getvalue()
            raise error
        quantized = onnx.load(str(dst), load_external_data=True)
    if not quantized.metadata_props:  # keep what the model says about its inputs (trtattn.inputs)
        quantized.metadata_props.extend(copy.deepcopy(list(model.metadata_props)))
    text = log.getvalue()
    records = inspect_sites(quantized, sites, cores, mode, text, named)
    return QuantizeResult(quantized, mode, records, settings, text)


def _modelopt():
    """modelopt.onnx.quantization, imported lazily; one sentence when it cannot be."""
    try:
        with _captured_log(io.StringIO()):
            import modelopt.onnx.quantization as mo
    except ImportError as e:
        why = " ".join(str(e).split()).replace(" Please install optional ``[onnx]`` dependencies.", "")
        raise MissingDependencyError(f"quantization needs NVIDIA ModelOpt's ONNX quantization ({why}); "
                                     f"install it with: {INSTALL}") from None
    return mo


def _large(model: onnx.ModelProto) -> bool:
    try:
        return model.ByteSize() > 2**31 - 1 - 2**20
    except Exception:
        return True


@contextlib.contextmanager
def _captured_log(buffer: io.StringIO):
    """Send everything ModelOpt logs to `buffer`: its own handler writes to stdout (it re-creates
    it on every call) and its records propagate to the root logger, which some of its modules
    also use directly. The root logger's handlers are swapped for one into `buffer` meanwhile."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = logging.StreamHandler(buffer)
    handler.addFilter(lambda r: not r.name.startswith("modelopt.onnx"))  # those reach stdout already
    handler.setFormatter(logging.Formatter("%(asctime)s - [%(name)s] - %(levelname)s - %(message)s"))
    root.handlers[:] = [handler]
    logger = logging.getLogger("modelopt.onnx")
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)  # ModelOpt's sessions: no optimizer chatter
    except ImportError:  # pragma: no cover
        pass
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            finally:
                for w in caught:
                    buffer.write(f"WARNING - {w.category.__name__}: {w.message} ({w.filename}:{w.lineno})\n")
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for h in logger.handlers[:]:
            logger.removeHandler(h)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        logger.addHandler(logging.NullHandler())


def _named_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose every node has a unique name (ModelOpt names unnamed nodes itself; naming them
    first keeps the names the sites are mapped by)."""
    named = copy.deepcopy(model)
    used = {n.name for n in named.graph.node if n.name}
    counts: dict[str, int] = {}
    for n in named.graph.node:
        if n.name and n.name not in counts:
            counts[n.name] = 1
            continue
        base = n.name or f"trtattn/{n.op_type}"
        i = counts.get(base, 0)
        while f"{base}_{i}" in used:
            i += 1
        n.name = f"{base}_{i}"
        counts[base] = i + 1
        used.add(n.name)
    return named


@dataclass
class _Core:
    softmax: str | None
    bmm1: str | None
    bmm2: str | None
    why: str = ""
    logit_ops: tuple[str, ...] = ()  # nodes between BMM1 and the Softmax that change the logits


def _cores(model: onnx.ModelProto, sites: list[AttentionSite]) -> list[_Core]:
    """The Softmax and the two MatMuls of each site, by node name."""
    from ..match.core import NotAttention, Unsupported, find_core
    from ..match.graph import GraphView

    graph = gs.import_onnx(model)
    view = GraphView(graph, model, fold=False)
    by_name = {n.name: n for n in graph.nodes}
    out = []
    for s in sites:
        if s.source != "pattern" or not s.softmax:
            out.append(_Core(None, None, None, f"a fused {s.source} op: ModelOpt places Q/DQ around "
                                               "MatMul/Softmax attention only"))
            continue
        sm = by_name.get(s.softmax)
        if sm is None:
            out.append(_Core(s.softmax, None, None, f"its Softmax {s.softmax} is not in the model"))
            continue
        try:
            core = find_core(view, sm)
        except (NotAttention, Unsupported) as e:
            out.append(_Core(s.softmax, None, None, f"no MatMul/Softmax/MatMul core: {e}"))
            continue
        out.append(_Core(sm.name, core.bmm1.name, core.bmm2.name,
                         logit_ops=tuple(st.node for st in core.steps if st.node)))
    return out


# ---------------------------------------------------------------- reading the quantized graph
def _producer(t) -> gs.Node | None:
    return t.inputs[0] if t is not None and t.inputs else None


def _scalar(t) -> float | None:
    if isinstance(t, gs.Constant):
        v = np.asarray(t.values)
    else:
        p = _producer(t)
        if p is None or p.op != "Constant" or "value" not in p.attrs:
            return None
        v = np.asarray(p.attrs["value"].values)
    if v.size != 1:
        return None  # per-channel: not an activation Q/DQ
    return float(np.asarray(v, dtype=np.float64).reshape(()))


def _elem_types(model: onnx.ModelProto) -> dict[str, str]:
    """Element type names ("int8", "float8e4m3fn", ...) of the constants and typed tensors of `model`."""
    out = {}
    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            out[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        out[init.name] = init.data_type
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = a.t.data_type
    return {k: onnx.helper.tensor_dtype_to_string(v).replace("TensorProto.", "").lower() for k, v in out.items()}


@dataclass
class _Pair:
    scale: float | None
    dtype: str | None
    q: gs.Node
    dq: gs.Node


def _qdq_pair(t, types: dict[str, str]) -> _Pair | None:
    """The Q -> DQ pair feeding `t` (through accumulation casts), or None."""
    node = _producer(t)
    while node is not None and node.op in _BETWEEN:
        node = _producer(node.inputs[0])
    if node is None or node.op != "DequantizeLinear":
        return None
    q = _producer(node.inputs[0])
    if q is None or q.op != "QuantizeLinear":
        return None  # a weight (constant) DQ, not an activation pair
    scale = _scalar(node.inputs[1])
    zp = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] is not None else None
    dtype = types.get(zp.name) if zp is not None and zp.name else types.get(node.inputs[0].name)
    return _Pair(scale, dtype, q, node)


def _reaches(t, node_name: str, budget: int = 8) -> bool:
    """Does `t` come from the node `node_name` through layout/cast ops and torch's NaN guard
    (Where(IsNaN(p), 0, p), which SDPA exports put after the Softmax) only?"""
    for _ in range(budget):
        p = _producer(t)
        if p is None:
            return False
        if p.name == node_name:
            return True
        if p.op == "Where" and len(p.inputs) == 3:
            cond = _producer(p.inputs[0])
            if cond is None or cond.op != "IsNaN" or cond.inputs[0] is not p.inputs[2]:
                return False
            t = p.inputs[2]
            continue
        if p.op not in _LAYOUT:
            return False
        t = p.inputs[0]
    return False


def _qdq_between(bmm1: gs.Node, softmax: gs.Node | None, depth: int = 16) -> list[str]:
    """Q/DQ nodes on the paths from BMM1's output to the Softmax."""
    if softmax is None:
        return []

    def reach(start: gs.Node, step) -> set[int]:
        seen, frontier = {}, [start]
        for _ in range(depth):
            nxt = []
            for n in frontier:
                for m in step(n):
                    if id(m) not in seen:
                        seen[id(m)] = m
                        nxt.append(m)
            frontier = nxt
        return seen

    down = reach(bmm1, lambda n: [c for t in n.outputs for c in t.outputs])
    up = reach(softmax, lambda n: [p for t in n.inputs if (p := _producer(t)) is not None])
    return sorted(down[k].name for k in down.keys() & up.keys()
                  if down[k].op in ("QuantizeLinear", "DequantizeLinear"))


def _output_pair(t, budget: int = 6) -> _Pair | None:
    """A Q -> DQ on the attention output, through layout ops with a single consumer each."""
    for _ in range(budget):
        consumers = list(t.outputs)
        if len(consumers) != 1:
            return None
        c = consumers[0]
        if c.op == "QuantizeLinear":
            dq = [n for n in c.outputs[0].outputs if n.op == "DequantizeLinear"]
            if not dq:
                return None
            scale = _scalar(c.inputs[1])
            return _Pair(scale, None, c, dq[0])
        if c.op not in _LAYOUT:
            return None
        t = c.outputs[0]
    return None


def inspect_sites(quantized: onnx.ModelProto, sites: list[AttentionSite], cores: list[_Core], mode: str,
                  log: str = "", original: onnx.ModelProto | None = None) -> list[SiteQuant]:
    """Read the Q/DQ around each site's MatMuls in the quantized model."""
    graph = gs.import_onnx(quantized)
    nodes = {n.name: n for n in graph.nodes}
    types = _elem_types(quantized)
    return [_inspect(nodes, types, s, c, mode, log, original) for s, c in zip(sites, cores)]


def _inspect(nodes: dict, types: dict, site: AttentionSite, core: _Core, mode: str, log: str, original) -> SiteQuant:
    rec = SiteQuant(site.name, False, bmm1=core.bmm1, bmm2=core.bmm2, softmax=core.softmax)
    if core.why:
        rec.reason = core.why
        return rec
    b1, b2 = nodes.get(core.bmm1), nodes.get(core.bmm2)
    if b1 is None or b2 is None:
        rec.reason = f"ModelOpt's preprocessing rewrote the attention MatMuls ({core.bmm1}, {core.bmm2} are gone)"
        return rec
    pairs = {"q": _qdq_pair(b1.inputs[0], types), "k": _qdq_pair(b1.inputs[1], types),
             "softmax": _qdq_pair(b2.inputs[0], types), "v": _qdq_pair(b2.inputs[1], types)}
    for role, pair in pairs.items():
        if pair is not None:
            setattr(rec, f"{role}_scale", pair.scale)
    out = _output_pair(b2.outputs[0])
    rec.output_scale = out.scale if out is not None else None
    dtypes = {p.dtype for p in pairs.values() if p is not None and p.dtype}
    rec.qdq_dtype = dtypes.pop() if len(dtypes) == 1 else (", ".join(sorted(dtypes)) or None)

    missing = [role for role, p in pairs.items() if p is None]
    if not missing:
        problems = []
        between = _qdq_between(b1, nodes.get(core.softmax))
        if between:
            problems.append(f"ModelOpt put Q/DQ between BMM1 and the Softmax ({', '.join(between)}), which TensorRT's "
                            "fused attention pattern does not allow")
        if not _reaches(pairs["softmax"].q.inputs[0], core.softmax):
            problems.append("the Q/DQ on BMM2's first input does not quantize the Softmax output")
        if any(p.scale is None or not np.isfinite(p.scale) or p.scale <= 0 for p in pairs.values()):
            problems.append("a Q/DQ scale is not one positive per-tensor value")
        if rec.qdq_dtype != QDQ_DTYPES[mode]:
            problems.append(f"the Q/DQ type is {rec.qdq_dtype}, not {QDQ_DTYPES[mode]}")
        rec.placed = not problems
        rec.reason = "; ".join(problems)
        return rec
    names = {"q": "Q", "k": "K", "softmax": "the Softmax output", "v": "V"}
    where = ", ".join(names[m] for m in missing)
    rec.reason = f"no Q/DQ on {where}: " + _why_not(core, mode, log, original, b1, b2, missing)
    return rec


# ---------------------------------------------------------------- ModelOpt's reasons
_MHA_DISABLED = re.compile(r"Disabling QDQ for MHA node (?P<node>.+?) due to (?P<why>.+)$", re.M)
_SMALL = re.compile(r"Excluding small-dim MatMul from quantization: (?P<node>.+?) \(N=(?P<n>\S+), K=(?P<k>\S+), "
                    r"threshold=(?P<t>\d+)\)", re.M)
_EXCLUDED = re.compile(r"- DEBUG - Matmul nodes to exclude: (?P<list>\[.*\])$", re.M)


def _why_not(core: _Core, mode: str, log: str, original, b1, b2, missing) -> str:
    reasons = []
    for m in _MHA_DISABLED.finditer(log):
        if m["node"].strip() == core.bmm1:
            why = m["why"].strip()
            if why.startswith("seq_len"):
                reasons.append(f"ModelOpt disables INT8 attention Q/DQ when the key length exceeds 512 ({why})")
            elif why.startswith("head_size"):
                reasons.append(f"ModelOpt disables FP8 attention Q/DQ outside head sizes 9..256 ({why})")
            elif "FP8 pattern" in why:
                reasons.append("ModelOpt disables FP8 attention Q/DQ: the attention is not NVIDIA's FP8 fMHA v2 "
                               "pattern (MatMul -> [Mul|Div] -> [Add] -> Softmax -> MatMul with only Reshape, "
                               f"Transpose, Flatten, Cast in between){_chain(original, core)}")
            else:
                reasons.append(f"ModelOpt disabled attention Q/DQ ({why})")
    small = {m["node"].strip(): m for m in _SMALL.finditer(log)}
    excluded: set[str] = set()
    for m in _EXCLUDED.finditer(log):
        try:
            excluded.update(ast.literal_eval(m["list"]))
        except (ValueError, SyntaxError):
            pass
    dims, gemv = [], []
    for label, name in (("BMM1", core.bmm1), ("BMM2", core.bmm2)):
        if name in small:
            m = small[name]
            dims.append(f"{label} N={m['n']}, K={m['k']}")
        elif name in excluded:
            gemv.append(label)
    if dims:
        t = next(iter(small.values()))["t"]
        reasons.append(f"ModelOpt skips small GEMMs for TensorRT ({'; '.join(dims)} at the calibration shapes, "
                       f"< {t}): calibrate at sequence lengths >= {t}")
    if gemv:
        reasons.append(f"ModelOpt skips GEMV MatMuls for TensorRT ({' and '.join(gemv)} have an M or N of 1 at the "
                       "calibration shapes: a one-token query or key)")
    if not reasons and original is not None:
        reasons.extend(_partition_reason(original, core))
    return "; ".join(dict.fromkeys(reasons)) or "ModelOpt left these inputs unquantized (no rule of it identified)"


def _chain(original, core: _Core) -> str:
    """' (here: MatMul -> Mul -> Add -> Add -> Softmax)': the logit ops of the site."""
    if original is None:
        return ""
    ops = {n.name: n.op_type for n in original.graph.node}
    chain = [ops[n] for n in core.logit_ops if n in ops and ops[n] not in ("Reshape", "Transpose", "Flatten", "Cast")]
    return f" (here: {' -> '.join(['MatMul', *chain, 'Softmax'])})"


def _partition_reason(original, core: _Core) -> list[str]:
    """ModelOpt's default placement keeps MatMul -> Add(non-constant) -> Softmax -> MatMul out of
    quantization (partitioning.find_mha_partitions)."""
    try:
        from modelopt.onnx.quantization.partitioning import find_mha_partitions
    except ImportError:
        return []
    graph = gs.import_onnx(original)
    level = logging.getLogger("modelopt.onnx").level
    try:
        partitions = find_mha_partitions(graph)
    finally:
        logging.getLogger("modelopt.onnx").setLevel(level)
    for p in partitions:
        if core.bmm1 in {n.name for n in p}:
            return ["ModelOpt's default placement treats MatMul -> Add (a non-constant mask) -> Softmax -> MatMul as "
                    "a non-quantizable MHA partition"]
    return []


# ---------------------------------------------------------------- running on CPU
def session(model: onnx.ModelProto):
    """An ONNX Runtime CPU session that can run FP8 Q/DQ (basic graph optimisations only)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compare(original: onnx.ModelProto, quantized: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> dict:
    """Max abs and relative (L2) error of every output of `quantized` against `original` on ORT CPU.

    Returns {output: {"max_abs": ..., "rel": ..., "ref_max": ...}} over all feeds (worst case)."""
    ref, new = session(original), session(quantized)
    names = [o.name for o in original.graph.output]
    errors: dict[str, dict] = {}
    for f in feeds:
        a = dict(zip(names, ref.run(names, f)))
        b = dict(zip(names, new.run(names, f)))
        for n in names:
            x = np.asarray(a[n], dtype=np.float64)
            y = np.asarray(b[n], dtype=np.float64)
            if not np.issubdtype(np.asarray(a[n]).dtype, np.floating):
                continue
            nan_x, nan_y = np.isnan(x), np.isnan(y)
            if (nan_x != nan_y).any():
                max_abs = rel = float("inf")  # NaN where the original has a number (or the reverse)
            else:
                x, y = np.where(nan_x, 0.0, x), np.where(nan_y, 0.0, y)
                max_abs = float(np.abs(x - y).max()) if x.size else 0.0
                rel = float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-12))
            e = errors.setdefault(n, {"max_abs": 0.0, "rel": 0.0, "ref_max": 0.0})
            e["max_abs"] = max(e["max_abs"], max_abs)
            e["rel"] = max(e["rel"], rel)
            e["ref_max"] = max(e["ref_max"], float(np.abs(np.where(nan_x, 0.0, x)).max()) if x.size else 0.0)
    return errors
