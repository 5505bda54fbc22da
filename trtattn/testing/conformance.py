"""onnx's backend node cases, the conformance suite of an op (`Attention`, `RotaryEmbedding`), taken from the
installed onnx (`onnx.backend.test.case.node.collect_testcases`): nothing is downloaded. Each case is a one-node
model (or, `expanded`, the same model with the op replaced by its function body) with reference inputs and outputs.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass

import numpy as np
import onnx

from ..report import verdict

# element types ONNX Runtime's CPU provider cannot run the op in: such cases are named, not counted
CPU_UNRUNNABLE = {onnx.TensorProto.BFLOAT16: "bf16"}


@dataclass(frozen=True)
class ConformanceCase:
    name: str  # onnx's name without the `test_` prefix, e.g. attention_4d_gqa_expanded
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]  # by graph input name
    outputs: dict[str, np.ndarray]  # reference outputs, by graph output name
    rtol: float
    atol: float

    @property
    def expanded(self) -> bool:
        return self.name.endswith("_expanded")

    @property
    def cpu_unrunnable(self) -> str | None:
        """Why ONNX Runtime's CPU provider cannot run this case ('bf16'), or None when it can."""
        for value in (*self.model.graph.input, *self.model.graph.output):
            reason = CPU_UNRUNNABLE.get(value.type.tensor_type.elem_type)
            if reason:
                return reason
        return None


@functools.cache
def _every_case() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # collecting runs every op's case generators, some of which overflow on purpose
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def _collected(op_type: str) -> tuple:
    # every op's cases, once: onnx imports its case modules once per process, so collect_testcases(op) for a
    # second op returns the first op's cases again (the filter acts only while the modules are first imported)
    prefix = "test_" + re.sub(r"(?<!^)(?=[A-Z])", "_", op_type).lower()
    return tuple(c for c in _every_case() if c.name == prefix or c.name.startswith(prefix + "_"))


def conformance_cases(op_type: str, *, expanded: bool | None = None) -> list[ConformanceCase]:
    """Every backend node case of `op_type` (only the expanded ones, or only the op ones, when `expanded` is
    given), one ConformanceCase per data set."""
    cases = []
    for case in _collected(op_type):
        name = case.name.removeprefix("test_")
        if expanded is not None and name.endswith("_expanded") != expanded:
            continue
        graph = case.model.graph
        for inputs, outputs in case.data_sets:
            cases.append(ConformanceCase(
                name, case.model,
                {value.name: np.asarray(array) for value, array in zip(graph.input, inputs)},
                {value.name: np.asarray(array) for value, array in zip(graph.output, outputs)},
                float(case.rtol), float(case.atol)))
    return cases


def op_node(case: ConformanceCase) -> onnx.NodeProto:
    """The op node of the case an expanded case was made from (`attention_4d_expanded` -> `attention_4d`)."""
    name = case.name.removesuffix("_expanded")
    op_type = _op_type(case)
    for other in _collected(op_type):
        if other.name.removeprefix("test_") == name:
            return next(n for n in other.model.graph.node if n.op_type == op_type)
    raise KeyError(f"no op case {name} for {case.name}")


def _op_type(case: ConformanceCase) -> str:
    return "RotaryEmbedding" if case.name.startswith("rotary_embedding") else "Attention"


# fp16 cases are compared at one half-precision step at magnitude 1 (2^-10): the fused op rounds once where the
# body rounds after each op
FP16_ATOL = 1e-3


@dataclass(frozen=True)
class FusedCase:
    """A case's model through trtattn's fuse (as the command runs it), run on ONNX Runtime against the case's
    reference outputs."""

    name: str
    fused: bool  # every site fused and verified
    ops: dict[str, int]  # op types of the fused model (the original's when nothing fused)
    max_abs_err: float | None  # of the fused model's outputs against the references (None: not fused)
    within: bool  # max_abs_err within the case's tolerance (FP16_ATOL for fp16 outputs, the bf16 one for bf16)
    reason: str  # why a site did not fuse ('' when all did)
    attention: dict | None = None  # the fused Attention node's attributes (fuse_rotation_case: the RotaryEmbedding's)
    run_on: str = "ONNX Runtime (CPU)"  # what ran the fused model: a bf16 one emulated in fp32


def fuse_case(case: ConformanceCase) -> FusedCase:
    """Read the case's model as the commands read it, fuse it verified on the case's own inputs, check what would
    be written, then run the fused model on ONNX Runtime and compare with onnx's reference outputs."""
    import collections

    from ..graph import validate
    from ..graph.user_inputs import GivenInputs
    from ..rewrite.fuse import fuse_model

    validate.check_read(case.model, case.name)
    result = fuse_model(case.model, inputs=GivenInputs(case.name, [case.inputs]))
    ops = dict(collections.Counter(n.op_type for n in result.model.graph.node))
    reason = "; ".join(r.reason for r in result.reports if r.status != "fused") or (
        "" if result.ok else f"verification: {verdict(result.verification)}")
    if not (result.ok and result.changed):
        return FusedCase(case.name, False, ops, None, False, reason or "nothing fused")
    validate.check(result.model, "the fused model")
    err, within, runner = reference_error(case, result.model)
    node = next((n for n in result.model.graph.node if n.op_type == "Attention"), None)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} if node is not None else None
    return FusedCase(case.name, True, ops, err, within, "", attrs, runner)


def reference_error(case: ConformanceCase, model: onnx.ModelProto) -> tuple[float, bool, str]:
    """`model` run on the case's inputs against onnx's reference outputs: (max abs error, within the case's
    tolerance (FP16_ATOL for fp16 outputs, the bf16 rewrite tolerance for bf16 cases), what ran it: ONNX Runtime,
    or for a bf16 case ONNX Runtime emulating bf16 in fp32 (precision/emulate.py), as fuse checked it)."""
    import onnxruntime

    from ..rewrite.precision.check import cpu_runner
    from ..verify import Check, tolerance

    if case.cpu_unrunnable == "bf16":
        run, runner = cpu_runner(model)
        got = run(case.inputs)
    else:
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got, runner = dict(zip([o.name for o in session.get_outputs()], session.run(None, case.inputs))), \
            "ONNX Runtime (CPU)"
    err, within = 0.0, True
    bf16_atol, bf16_rtol = tolerance(Check.REWRITE, "bf16")
    for name, want in case.outputs.items():
        have = got[name]
        fp16, bf16 = want.dtype == np.float16, case.cpu_unrunnable == "bf16"
        atol = max(case.atol, FP16_ATOL) if fp16 else max(case.atol, bf16_atol) if bf16 else case.atol
        rtol = max(case.rtol, bf16_rtol) if bf16 else case.rtol  # bf16: the project's rewrite tolerance
        a, b = have.astype(np.float64), want.astype(np.float64)
        agree = (a == b) | (np.isnan(a) & np.isnan(b))  # equal infinities (a -inf masked logits output) agree
        with np.errstate(invalid="ignore"):
            diff = np.where(agree, 0.0, np.abs(a - b))
        err = max(err, float(np.max(diff, initial=0.0)))
        within = within and bool(np.all(diff <= atol + rtol * np.where(agree, 0.0, np.abs(b))))
    return err, within, runner


@dataclass(frozen=True)
class NormalizedCase:
    """A case's model through trtattn's normalize (as the command runs it, verified on the case's own inputs)."""

    name: str
    exit: int  # what `trtattn normalize` exits with: 0 written and verified, 1 not (a site named, or not verified)
    verified: bool | None  # the verification against the original (None: not run, nothing changed)
    actions: list[str]  # per site: what normalize did, or why it skipped it
    max_abs_err: float | None  # of the written model against onnx's reference (None: not written)
    within: bool  # max_abs_err within the case's tolerance

    @property
    def named(self) -> list[str]:
        """Why sites were left (exit 1 with the site named)."""
        return [a for a in self.actions if a.startswith("skipped")]


def normalize_case(case: ConformanceCase) -> NormalizedCase:
    """Read the case's model as the commands read it, normalize it verified on the case's own inputs, and run
    what would be written against onnx's reference outputs."""
    from ..graph import validate
    from ..graph.user_inputs import GivenInputs
    from ..rewrite.normalize import normalize_model

    validate.check_read(case.model, case.name)
    result = normalize_model(case.model, inputs=GivenInputs(case.name, [case.inputs]))
    actions = [r.action for r in result.sites] + [f"skipped: {s.name}: {s.reason}" for s in result.skipped]
    verified = result.verification.passed
    if not result.ok:
        return NormalizedCase(case.name, 1, verified, actions, None, False)
    validate.check(result.model, "the normalized model")
    err, within, _ = reference_error(case, result.model)
    return NormalizedCase(case.name, 0, verified, actions, err, within)


def inside_attention(case: ConformanceCase) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A RotaryEmbedding case's model applied to Q and to K of an attention (Q.K^T * 0.3 -> Softmax -> . V over the
    case's input shape, its other inputs shared), and inputs for it (the case's tables and positions)."""
    import onnx.compose

    f = onnx.TensorProto.FLOAT
    x = case.inputs["input"]
    graph = case.model.graph
    shared = [i for i in graph.input if i.name != "input"]
    nodes = []
    for side in ("q", "k"):
        nodes += [onnx.helper.make_node("Identity", [i.name], [f"{side}_{i.name}"]) for i in shared]
        nodes.append(onnx.helper.make_node("Identity", [side], [f"{side}_input"]))
        nodes += list(onnx.compose.add_prefix(case.model, f"{side}_").graph.node)
    nodes += [onnx.helper.make_node("Transpose", ["k_output"], ["kt"], perm=[0, 1, 3, 2] if x.ndim == 4 else [0, 2, 1]),
              onnx.helper.make_node("MatMul", ["q_output", "kt"], ["qk"]),
              onnx.helper.make_node("Mul", ["qk", "scale"], ["logits"]),
              onnx.helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
              onnx.helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [onnx.helper.make_tensor_value_info(n, f, x.shape) for n in "qkv"] + shared
    model = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "rope_attention", inputs, [onnx.helper.make_tensor_value_info("y", f, x.shape)],
                               [onnx.helper.make_tensor("scale", f, [], [0.3])]),
        opset_imports=list(case.model.opset_import))
    rng = np.random.default_rng(0)
    feeds = {k: v for k, v in case.inputs.items() if k != "input"}
    feeds.update({n: rng.standard_normal(x.shape).astype(np.float32) for n in "qkv"})
    return model, feeds


def fuse_rotation_case(case: ConformanceCase) -> FusedCase:
    """A RotaryEmbedding case's body on Q and K of an attention (inside_attention) through fuse, verified on its
    inputs; then the fused model with the case's own input as Q, the RotaryEmbedding op written on Q compared with
    onnx's reference output. `fused`: every site fused and verified and a RotaryEmbedding op written on Q."""
    import collections

    import onnxruntime

    from ..graph.user_inputs import GivenInputs
    from ..rewrite.fuse import fuse_model

    model, feeds = inside_attention(case)
    result = fuse_model(model, inputs=GivenInputs(case.name, [feeds]))
    ops = dict(collections.Counter(n.op_type for n in result.model.graph.node))
    reason = "; ".join(r.reason for r in result.reports if r.status != "fused") or (
        "" if result.ok else f"verification: {verdict(result.verification)}")
    rope = result.reports[0].site.rope if result.reports else None
    on_q = next((n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"
                 and rope is not None and n.input[0] == rope.q_input), None)
    if not (result.ok and result.changed) or on_q is None:
        return FusedCase(case.name, False, ops, None, False, reason or "the rotation was not read as a RotaryEmbedding")
    fused = onnx.ModelProto()
    fused.CopyFrom(result.model)
    fused.graph.output.append(onnx.helper.make_tensor_value_info(on_q.output[0], onnx.TensorProto.FLOAT, None))
    session = onnxruntime.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run([on_q.output[0]], {**feeds, "q": case.inputs["input"]})[0]
    want = case.outputs["output"]
    err = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
    within = bool(np.allclose(got, want, rtol=case.rtol, atol=case.atol))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in on_q.attribute}
    return FusedCase(case.name, True, ops, err, within, "", attrs)
