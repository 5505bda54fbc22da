"""Why ModelOpt left an attention without Q/DQ, in its own words: the rule is read from its debug log
and its pattern functions, never patched by hand. The log wording is ModelOpt 0.47's (pinned ~=0.47
in pyproject.toml); this is the only module that reads it.

- a small or vector GEMM at the calibration shapes (M or N == 1, or K or N < 16): ModelOpt skips
  such MatMuls for TensorRT performance, so calibrate at realistic sequence lengths (>= 16);
  a one-token decode step (query length 1) is a GEMV and is never quantized;
- INT8: a key length > 512 (TensorRT's INT8 fused attention limit);
- FP8: a head size outside 9..256, or an attention ModelOpt recognises as MHA that is not NVIDIA's
  FP8 fMHA v2 pattern (MatMul -> [Mul|Div] -> [Add] -> Softmax -> MatMul with only Reshape,
  Transpose, Flatten, Cast between; T5's bias Add + mask Add is not: normalise first);
- ModelOpt's default placement ("modelopt" selection): MatMul -> Add(non-constant mask) -> Softmax
  -> MatMul is a non-quantizable partition.
"""

from __future__ import annotations

import ast
import logging
import re

import onnx
import onnx_graphsurgeon as gs

_MHA_DISABLED = re.compile(r"Disabling QDQ for MHA node (?P<node>.+?) due to (?P<why>.+)$", re.MULTILINE)
_SMALL = re.compile(r"Excluding small-dim MatMul from quantization: (?P<node>.+?) \(N=(?P<n>\S+), K=(?P<k>\S+), "
                    r"threshold=(?P<t>\d+)\)", re.MULTILINE)
_EXCLUDED = re.compile(r"- DEBUG - Matmul nodes to exclude: (?P<list>\[.*\])$", re.MULTILINE)
_LAYOUT_OPS = ("Reshape", "Transpose", "Flatten", "Cast")


def why_not(core, log: str, original: onnx.ModelProto | None) -> str:
    """The ModelOpt rules that left the attention `core` (sites.CoreNodes) without its Q/DQ, read from
    ModelOpt's debug `log` and, failing that, its MHA partitioning of `original` (the model it was given)."""
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


def _chain(original: onnx.ModelProto | None, core) -> str:
    """' (here: MatMul -> Mul -> Add -> Add -> Softmax)': the logit ops of the site."""
    if original is None:
        return ""
    ops = {n.name: n.op_type for n in original.graph.node}
    chain = [ops[n] for n in core.logit_ops if n in ops and ops[n] not in _LAYOUT_OPS]
    return f" (here: {' -> '.join(['MatMul', *chain, 'Softmax'])})"


def _partition_reason(original: onnx.ModelProto, core) -> list[str]:
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
            return [("ModelOpt's default placement treats MatMul -> Add (a non-constant mask) -> Softmax -> MatMul "
                     "as a non-quantizable MHA partition")]
    return []
