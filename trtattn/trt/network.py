"""Parse the cut ONNX graph with TensorRT's OnnxParser, lower every planned op, and reconnect.

    network = build_network(trt, builder, logger, cut_model, plan)

After lowering, each placeholder input (the stand-in for a lowered op's output that ONNX nodes
still read) is replaced in every layer that reads it by the TensorRT layer's output and removed;
the exposed tensors stop being outputs; outputs the lowered layers produce (updated caches) are
marked under their ONNX names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from ..errors import TrtattnError
from ..graph.io import session_source
from .cut import CutModel
from .lower import LOWER
from .plan import BuildPlan


def create_network(trt, builder):
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder.create_network(flags)


def parse(trt, network, logger, cut: CutModel) -> None:
    parser = trt.OnnxParser(network, logger)
    with session_source(cut.model) as source:  # bytes, or a file with external data past 2 GB
        ok = parser.parse(source) if isinstance(source, bytes) else parser.parse_from_file(source)
    if not ok:
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise TrtattnError("TensorRT's ONNX parser rejected the model: " + "; ".join(errors[:5]))


def _tensors(network) -> dict:
    found = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        found[t.name] = t
    for i in range(network.num_outputs):
        t = network.get_output(i)
        found[t.name] = t
    return found


def build_network(trt, builder, logger, cut: CutModel, plan: BuildPlan):
    network = create_network(trt, builder)
    parse(trt, network, logger, cut)
    tensors = _tensors(network)
    produced: dict[str, Any] = {}  # TensorRT ITensors (its bindings are untyped)

    def get(name: str):
        if name in produced:
            return produced[name]
        key = cut.exposed.get(name, name)
        if key not in tensors:
            raise TrtattnError(f"tensor '{name}' is not in the parsed network")
        return tensors[key]

    lowered = plan.lowered()
    for node in plan.order:
        p = lowered[node]
        lower = cast(Callable[..., Any], LOWER[type(p)])  # LOWER maps each plan type to its lowering
        produced[p.output] = lower(trt, network, p, get)

    reconnect(network, tensors, produced, cut.placeholders)
    for exposed in cut.exposed.values():
        if exposed in tensors and tensors[exposed].is_network_output and exposed not in {o.name for o in plan.outputs}:
            network.unmark_output(tensors[exposed])
    for name in cut.layer_outputs:
        t = produced[name]
        t.name = name
        network.mark_output(t)
    if plan.mark_sites:  # under the ONNX names, so verification lines them up with the original's
        for a in plan.native:
            t = produced[a.output]
            if not t.is_network_output:
                t.name = a.output
                network.mark_output(t)
    return network


def reconnect(network, tensors: dict, produced: dict, placeholders: list[str]) -> None:
    """Feed every layer that reads a placeholder from the lowered layer instead, then drop it."""
    for name in placeholders:
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            for j in range(layer.num_inputs):
                t = layer.get_input(j)
                if t is not None and t.name == name:
                    layer.set_input(j, produced[name])
        network.remove_tensor(tensors[name])
