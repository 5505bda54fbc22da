"""onnx's backend node cases, the conformance suite of an op (`Attention`, `RotaryEmbedding`), taken from the
installed onnx (`onnx.backend.test.case.node.collect_testcases`): nothing is downloaded. Each case is a one-node
model (or, `expanded`, the same model with the op replaced by its function body) with reference inputs and outputs.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import onnx

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
def _collected(op_type: str) -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # collecting runs every op's case generators, some of which overflow on purpose
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(op_type))


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
