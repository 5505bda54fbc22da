"""Whole-model FP16 / BF16 by NVIDIA ModelOpt's AutoCast (see the package doc for what is added to it)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from ...errors import MissingDependencyError, TrtattnError, require
from ...graph.external import data_dir
from ...graph.io import scratch_dir
from ...graph.precision import ELEM_PRECISIONS, FLOAT_ELEMS, LOW_FLOATS
from .common import (
    INSTALL,
    LARGE,
    NO_MATH,
    ONNX_DOMAINS,
    PrecisionError,
    declared_types,
)
from .widen import narrow_io, widened, widened_feeds
from .work import count_work, declared_dtypes, infer_static, shares


@dataclass
class Converted:
    model: onnx.ModelProto
    precision: str
    kept_fp32: dict[str, str]  # node -> why it computes in fp32 (AutoCast's log, or this module's rule)
    table: dict[str, float]  # share of matmul work per dtype, at the first calibration feed's shapes
    log: str = field(default="", repr=False)  # AutoCast's log, for --debug


def convert(model: onnx.ModelProto | str | os.PathLike, precision: str, *, keep_io_types: bool = True,
            keep_fp32: Sequence[str] = (), calibration_feeds: Mapping | Sequence[Mapping] | None = None) -> Converted:
    """`model` (a ModelProto, not modified, or a path: only its graph is loaded here) in fp16 or bf16.
    keep_fp32: node names that stay fp32. calibration_feeds: a feed dict or a list of them, AutoCast's
    classifier reads every tensor's range on them (None: AutoCast's own uniform [-1, 1] inputs with
    dynamic dims 1, which say little about masks); the table is counted at the first one's shapes."""
    if precision not in LOW_FLOATS:
        raise TrtattnError(f"unknown precision '{precision}'; choose one of: {', '.join(LOW_FLOATS)}")
    autocast = load_autocast()
    feeds = [calibration_feeds] if isinstance(calibration_feeds, Mapping) else list(calibration_feeds or [])
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(scratch_dir("autocast")))  # pid-named: a killed run's goes next time
        if isinstance(model, onnx.ModelProto):  # weights left on disk (graph.io.load): read from their folder
            work, src_dir = copy.deepcopy(model), data_dir(model)
        elif Path(model).is_file():
            work, src_dir = onnx.load(str(model), load_external_data=False), Path(model).parent
        else:
            raise TrtattnError(f"{model}: no such model file")
        _refuse_foreign_ops(work)
        _name_nodes(work)
        work, wide_io = widened(work, precision, src_dir)  # fp16 for bf16 (or the reverse): AutoCast goes from fp32
        if src_dir is not None and work.ByteSize() > LARGE:  # only widened weights are in memory here
            raise PrecisionError(f"{model}: its weights widened to fp32 for AutoCast exceed protobuf's 2 GB; convert "
                                 "it from an fp32 export instead")
        feeds = [widened_feeds(f, wide_io) for f in feeds]
        missing = sorted(set(keep_fp32) - {n.name for n in work.graph.node})
        if missing:
            raise TrtattnError(f"keep_fp32 names no node of the model: {', '.join(missing)}")
        types, static_shapes = infer_static(work)
        ours = {n: "asked (keep_fp32)" for n in keep_fp32}
        for n, why in _position_arithmetic(work, types).items():
            ours[n] = why
        if precision == "fp16":
            for n in _clamp_masks(work, types, {k: len(v) for k, v in static_shapes.items()}):
                ours[n] = "clamps an attention mask to fp16's range before its Cast"
        attentions = [n.name for n in work.graph.node if n.op_type == "Attention" and n.domain in ONNX_DOMAINS]
        props = list(work.metadata_props)
        path = _stage(work, tmp, src_dir, stack)
        # counted on the fp32 model, which ONNX Runtime runs if the shapes need a run (bf16 it cannot)
        external = any(i.data_location == TensorProto.EXTERNAL for i in work.graph.initializer)
        work_done = count_work(work, feeds[0] if feeds else None, None, None, path.parent if external else None)
        del work
        calib = tmp / "calibration"
        for i, f in enumerate(feeds):  # one .npz per batch: AutoCast aggregates the ranges
            calib.mkdir(exist_ok=True)
            np.savez(calib / f"{i:04d}.npz", **{k: np.asarray(v) for k, v in f.items()})  # type: ignore[arg-type]  # numpy's stub types **kwds as its allow_pickle flag
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
    if keep_io_types:
        narrow_io(out, wide_io)
    _types_only(out)
    check_attention_types(out)
    dtypes = {w.node: w.dtype for w in declared_dtypes(out)}
    table = shares([dataclasses.replace(w, dtype=dtypes.get(w.node, w.dtype)) for w in work_done])
    return Converted(out, precision, _kept_fp32(out, log.getvalue(), ours), table, log.getvalue())


def check_attention_types(model: onnx.ModelProto) -> None:
    """A PrecisionError naming the Attention node whose float inputs (Q, K, V, a float mask, the past caches) are
    not all in one dtype: IAttention computes in its query's dtype and takes the others in it."""
    types = declared_types(model)
    for n in model.graph.node:
        if n.op_type != "Attention" or n.domain not in ONNX_DOMAINS:
            continue
        read = {t: types.get(t) for i, t in enumerate(n.input[:6]) if t and (i != 3 or types.get(t) in FLOAT_ELEMS)}
        if len({d for d in read.values() if d is not None}) > 1:
            said = ", ".join(f"{t} {ELEM_PRECISIONS.get(d or 0) or d}" for t, d in read.items())
            raise PrecisionError(f"Attention node {n.name} reads its inputs in different dtypes ({said}): IAttention "
                                 "takes Q, K, V, a float mask and the caches in one dtype")


def _types_only(model: onnx.ModelProto) -> None:
    """Keep the element types AutoCast wrote on intermediate tensors, drop their shapes: on dynamo exports its
    inference names different sizes alike (GQA's 2 and 4 heads), and ONNX Runtime's memory planner then
    re-uses one buffer for both ("Shape mismatch attempting to re-use buffer")."""
    for vi in model.graph.value_info:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")


def load_autocast():
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
    """The file AutoCast reads. A model loaded from a path, or with its weights left on disk, keeps its
    weights where they are: the copy is written in their folder under a hidden name, so that their
    locations (relative to the model's folder) resolve, and removed afterwards (onnx refuses external data
    reached through a symbolic or hard link; written elsewhere, the copy's weights were looked for there)."""
    if src_dir is None:
        path, large = tmp / "model.onnx", work.ByteSize() > LARGE
        onnx.save_model(work, str(path), save_as_external_data=large, all_tensors_to_one_file=True,
                        location="model.onnx.data" if large else None)
        return path
    path = src_dir / f".trtattn-autocast-{tmp.name}.onnx"
    stack.callback(path.unlink, missing_ok=True)
    try:
        onnx.save_model(work, str(path))
    except OSError as e:
        raise TrtattnError(f"cannot write AutoCast's copy of the model beside its weights in {src_dir} ({e}): "
                           "AutoCast reads external data only from the model's folder; make it writable or load the "
                           "weights into memory") from None
    return path


def _refuse_foreign_ops(model: onnx.ModelProto) -> None:
    foreign = [f"{n.name or n.op_type} ({n.domain}:{n.op_type})" for n in model.graph.node
               if n.domain not in ONNX_DOMAINS]
    if foreign:
        raise PrecisionError(
            f"AutoCast cannot convert ops outside the ONNX domain: {', '.join(foreign[:6])}"
            f"{' ...' if len(foreign) > 6 else ''}. It reads them as TensorRT plugins (it needs TensorRT for that) "
            "and moves com.microsoft ops named like an ONNX op (Attention, RotaryEmbedding) into the ONNX domain, "
            "whose inputs differ; convert them to standard ONNX ops first (trtattn fuse)")
    bodies = [f"{n.name or n.op_type} ({n.op_type})" for n in model.graph.node
              if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)]
    if bodies:  # AutoCast 0.47 fails inside them with a KeyError or a Polygraphy error that names nothing
        raise PrecisionError(
            f"AutoCast cannot convert a model with control flow: {', '.join(bodies[:6])}"
            f"{' ...' if len(bodies) > 6 else ''} hold subgraphs. Build it in fp32 (--precision fp32), or export "
            "the branch you deploy without the If/Loop/Scan")


def _name_nodes(model: onnx.ModelProto) -> None:
    """A unique name for every node: AutoCast's rules and its log go by name."""
    used: set[str] = set()
    for i, n in enumerate(model.graph.node):
        base, k = n.name or f"trtattn/{n.op_type}_{i}", 0
        while n.name in used or not n.name:
            n.name, k = f"{base}_{k}", k + 1
        used.add(n.name)


def _clamp_masks(model: onnx.ModelProto, types: dict[str, int], ranks: dict[str, int]) -> list[str]:
    """Every float attn_mask of an Attention brought into fp16's range in fp32, before AutoCast casts it: the
    nodes added. Masked values go to fp16's replacing fill, not its lowest value (which ONNX Runtime reads as
    -inf, zeroing a fully masked row the model keeps uniform); -inf stays -inf. A row masked everywhere
    gets a zero query (`_dead_rows`)."""
    from ...match.logit_ops.boolean import replacing_fill

    clamped: dict[str, tuple[str, str | None]] = {}  # mask -> (clamped mask, its dead rows if any)
    floor, position = "trtattn/fp16_mask_floor", 0

    def insert(added: list) -> None:  # before the node at `position`, which then moves past them
        nonlocal position
        for n in added:
            model.graph.node.insert(position, n)
            position += 1

    while position < len(model.graph.node):
        node = model.graph.node[position]
        mask = node.input[3] if node.op_type == "Attention" and len(node.input) > 3 else ""
        if mask and types.get(mask) == TensorProto.FLOAT:
            if mask not in clamped:
                base = f"{node.name}/fp16_mask_clamp"
                added = [onnx.helper.make_node("Max", [mask, floor], [f"{mask}/floored"], name=base),
                         onnx.helper.make_node("IsInf", [mask], [f"{mask}/minus_inf"], detect_positive=0,
                                               name=f"{base}/is_minus_inf"),
                         onnx.helper.make_node("Where", [f"{mask}/minus_inf", mask, f"{mask}/floored"],
                                               [f"{mask}/fp16_clamped"], name=f"{base}/keep_minus_inf")]
                clamped[mask] = (f"{mask}/fp16_clamped", _dead_rows(mask, ranks.get(mask), base, added))
                insert(added)
            node.input[3], dead = clamped[mask]
            if dead and ranks.get(node.input[0]) in (3, 4):
                added = []
                if ranks[node.input[0]] == 3 and ranks[mask] == 4:  # [B, 1, Sq, 1] rows for a [B, Sq, N*H] query
                    added.append(onnx.helper.make_node("Squeeze", [dead, "trtattn/axis_1"], [f"{node.name}/dead_rows_3d"],
                                                       name=f"{node.name}/fp16_mask_clamp/dead_rows_3d"))
                added.append(onnx.helper.make_node("Where", [added[-1].output[0] if added else dead, "trtattn/zero",
                                                             node.input[0]],
                                                   [f"{node.name}/query_dead_rows_zeroed"], name=f"{node.name}/dead_rows"))
                node.input[0] = added[-1].output[0]
                insert(added)
        position += 1
    if clamped:
        constants = {floor: np.float32(replacing_fill(np.float16)), "trtattn/zero": np.float32(0),
                     "trtattn/dead_row": np.float32(DEAD_ROW), "trtattn/axis_1": np.array([1])}
        constants.update({f"trtattn/mask_row_axes_{r}": np.array(a) for r, a in MASK_ROW_AXES.items()})
        read = {i for n in model.graph.node for i in n.input}
        for name, value in constants.items():
            if name in read:  # only the constants the added nodes use
                model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(value), name))
    return [n.name for n in model.graph.node if "/fp16_mask_clamp" in n.name]


def _dead_rows(mask: str, rank: int | None, base: str, added: list) -> str | None:
    """[.., Sq, 1] booleans: the query rows the mask masks everywhere (every key, every head of a 4-D mask)
    by at least DEAD_ROW: in fp32 their logits vanish under the fill (rounded away), so the row is
    uniform (DeBERTa's padded queries under HF's finfo.min). No fp16 fill swamps the logits in a kernel that
    accumulates in fp32 (TensorRT's, the plugins'); a zero query makes every logit of the row the fill again."""
    if rank not in MASK_ROW_AXES:
        return None
    added += [onnx.helper.make_node("ReduceMax", [mask, f"trtattn/mask_row_axes_{rank}"], [f"{mask}/row_max"],
                                    keepdims=1, name=f"{base}/row_max"),
              onnx.helper.make_node("LessOrEqual", [f"{mask}/row_max", "trtattn/dead_row"], [f"{mask}/dead_rows"],
                                    name=f"{base}/dead_rows")]
    return f"{mask}/dead_rows"


DEAD_ROW = -1e9  # fp32's spacing there is 64: logits are rounded away
MASK_ROW_AXES = {2: [1], 3: [0, 2], 4: [1, 3]}  # the key axis, and the heads axis where there is one


INTEGERS = (TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT8)


def _position_arithmetic(model: onnx.ModelProto, types: dict[str, int]) -> dict[str, str]:
    """Float nodes computing from positions alone (weights, constants and integer tensors only) that end in
    a Sin/Cos (rotary angles: fp16/bf16 cannot hold position x frequency) or a Cast to an integer (an
    index computed in float, as DeBERTa's log-bucketed relative positions). A Sin/Cos of an activation is
    left to AutoCast."""
    derived = {i.name for i in model.graph.initializer} | {t for t, ty in types.items() if ty not in FLOAT_ELEMS}
    for n in model.graph.node:  # topological order
        if all(t in derived for t in n.input if t):
            derived.update(n.output)
    producer = {o: n for n in model.graph.node for o in n.output}
    why = {"Sin": "rotary angle: fp16/bf16 cannot hold position x frequency",
           "Cast": "computes an index in float: fp16/bf16 rounding could move it"}
    keep: dict[str, str] = {}
    frontier = [(n, why["Sin"]) for n in model.graph.node if n.op_type in ("Sin", "Cos") and n.output[0] in derived]
    frontier += [(producer[n.input[0]], why["Cast"]) for n in model.graph.node
                 if n.op_type == "Cast" and n.input[0] in producer and n.input[0] in derived
                 and types.get(n.input[0]) in FLOAT_ELEMS and onnx.helper.get_attribute_value(n.attribute[0]) in INTEGERS]
    while frontier:
        node, reason = frontier.pop()
        if node.name in keep:
            continue
        if any(types.get(t) in FLOAT_ELEMS for t in node.output):
            keep[node.name] = reason
        frontier += [(producer[t], reason) for t in node.input
                     if t in producer and t in derived and types.get(t) in FLOAT_ELEMS]
    return keep


def _kept_fp32(model: onnx.ModelProto, log: str, ours: dict[str, str]) -> dict[str, str]:
    """Every node computing in fp32 in the converted model, with the reason AutoCast logged or ours."""
    skipped = re.finditer(r"Skipping node (.+?): (.+)$", log, re.M)  # the first rule that matched
    reasons = {m.group(1): m.group(2).strip() for m in reversed(list(skipped))}
    unsupported = re.search(r"ops are not supported in '(\w+)' in opset (\d+).*?(\{.*\})", log)
    types = declared_types(model)
    kept = {}
    for n in model.graph.node:
        if n.op_type in NO_MATH or TensorProto.FLOAT not in {types.get(t) for t in [*n.input, *n.output] if t}:
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
    # the handler on AutoCast's own logger too: a parent that stops propagation (modelopt.onnx, after a
    # quantization ran in this process) would otherwise drop the classifier's reasons
    root.handlers[:], autocast.handlers[:], autocast.propagate = [handler], [handler], False
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
