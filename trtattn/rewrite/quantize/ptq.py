"""ModelOpt's ONNX post-training quantization, run on CPU and configured for TensorRT's fused attention.

ModelOpt (`modelopt.onnx.quantization.quantize`) places the Q/DQ and calibrates, on ONNX Runtime's
CPUExecutionProvider; trtattn never places Q/DQ itself. It is configured for the pattern TensorRT's
fused FP8/INT8 attention takes (sites.py):

- selection "gemm" (default): ModelOpt quantizes every MatMul, Gemm and Conv, the attention
  MatMuls included. ModelOpt's default placement ("modelopt") also quantizes Add/Mul/norm inputs
  and treats MatMul -> Add(non-constant mask) -> Softmax -> MatMul (trtattn's normalised form, Swin,
  T5 with SDPA) as a non-quantizable partition, although its own FP8 fMHA pattern accepts it;
- the logit ops of every site (scale, mask, bias between BMM1 and the Softmax) are excluded:
  ModelOpt's Add rule would otherwise quantize the mask Add, whose finfo.min entries overflow an
  fp16 scale into inf (NaN outputs) and push the logits to zero.

Precision: high_precision_dtype "fp16" (ModelOpt's default, what TensorRT runs around FP8/INT8
attention) converts the rest of the model to fp16; a mask built from finfo(float32).min then holds
-inf, so a fully masked row (a padding query) gives NaN on ONNX Runtime. Verify with inputs
without padding, or quantize with "fp32".
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ...errors import MissingDependencyError, TrtattnError
from ...graph import io as onnxio
from ...graph.user_inputs import InputsUsed
from ...match import match
from ...site import AttentionSite
from .calibration import check_calibration
from .sites import MODES, SiteQuant, find_cores, inspect_sites

HIGH_PRECISION = ("fp32", "fp16", "bf16")
SELECTIONS = ("gemm", "modelopt")
GEMM_OPS = ("MatMul", "Gemm", "Conv")
INSTALL = "pip install 'trtattn[quant]' (NVIDIA ModelOpt without its onnxruntime-gpu)"


class QuantizationError(TrtattnError):
    """ModelOpt failed on the model."""

    log: str = ""  # ModelOpt's debug log, for --debug


@dataclass(frozen=True)
class QuantAccuracy:
    """The quantized model against its fp32 original: each float output's worst errors (compare), the worst
    relative L2 error and the bound it is judged within."""

    outputs: dict[str, dict[str, float]]
    worst_relative: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.worst_relative <= self.tolerance

    def to_json(self) -> dict:
        return {"outputs": self.outputs, "worst_relative": self.worst_relative, "tolerance": self.tolerance,
                "passed": self.passed}


@dataclass(frozen=True)
class QuantSummary:
    """What quantization did: the mode, where the Q/DQ came from, what ModelOpt was asked (its settings), each
    site's Q/DQ, the accuracy against fp32 and the user's inputs it was measured on. JSON only where written
    (normalize's report)."""

    mode: str
    source: str = ""  # "ModelOpt PTQ", "the model's own Q/DQ"; "": not said (normalize --quantize)
    settings: dict = field(default_factory=dict)  # ModelOpt's keyword arguments, as it names them ({}: not run)
    sites: tuple[SiteQuant, ...] = ()
    accuracy: QuantAccuracy | None = None  # None: not compared with fp32 (yet, or the model's own Q/DQ)
    inputs: InputsUsed | None = None  # None: measured on generated inputs

    @property
    def placed(self) -> int:
        return sum(s.placed for s in self.sites)

    def to_json(self) -> dict:
        if not self.settings:  # the model's own Q/DQ: ModelOpt was not run, so nothing was placed or measured
            data: dict = {"mode": self.mode, "source": self.source}
        else:
            data = {**({"source": self.source} if self.source else {}), "mode": self.mode, **self.settings,
                    "sites": [s.row() for s in self.sites], "placed": self.placed, "total": len(self.sites)}
            if self.accuracy is not None:
                data["accuracy"] = self.accuracy.to_json()
        return {**data, "inputs": self.inputs.to_json()} if self.inputs is not None else data


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

    def summary(self) -> QuantSummary:
        return QuantSummary(self.mode, settings=self.settings, sites=tuple(self.sites))


def quantize(model: onnx.ModelProto, mode: str, calib: dict[str, np.ndarray], sites: list[AttentionSite] | None = None,
             *, calibration_method: str | None = None, high_precision_dtype: str = "fp16",
             mha_accumulation_dtype: str = "fp16", selection: str = "gemm",
             workdir: str | os.PathLike | None = None, extra_options: dict | None = None) -> QuantizeResult:
    """Quantize `model` (not modified) with ModelOpt and report each attention site's Q/DQ.

    mode: "fp8" or "int8". calib: arrays keyed by input name (see calibration.check_calibration).
    sites: the attention sites of `model` (default: trtattn.match.match(model)); pattern sites only.
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
        sites = match(named).sites
    cores = find_cores(named, sites)

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
            stack.enter_context(onnxio.scratch_dir("quant")))
        src, dst = tmp / "model.onnx", tmp / f"model.{mode}.onnx"
        large = onnxio.is_large(named)
        onnxio.save(named, src, external_data=large)
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
            raise _failed(f"ModelOpt {mode} quantization failed: {type(e).__name__}: {first}", log) from None
        if not dst.exists():
            raise _failed(f"ModelOpt {mode} quantization wrote no model", log)
        quantized = onnxio.load(dst)
    if not quantized.metadata_props:  # keep what the model says about its inputs (trtattn.graph.roles)
        quantized.metadata_props.extend(copy.deepcopy(list(model.metadata_props)))
    text = log.getvalue()
    records = inspect_sites(quantized, sites, cores, mode, text, named)
    return QuantizeResult(quantized, mode, records, settings, text)


def _failed(message: str, log: io.StringIO) -> QuantizationError:
    error = QuantizationError(message)
    error.log = log.getvalue()  # ModelOpt's debug log, for --debug
    return error


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
