"""The quantization step a dynamically quantized model takes after its attention: a DynamicQuantizeLinear
downstream of a site computes its scale at run time from the values it reads, (max - min) / 255, so a fused
site whose output differs from the original's by a rounding error can land an element one step to the other
side of a rounding boundary. The layers after it then see a difference of one step, not of the rounding
error: that step, evaluated on the verification inputs, is how far the outputs may move (tolerance.requantized)."""

from __future__ import annotations

import numpy as np
import onnx

from ..graph.evaluate import ort_session


def downstream_quantizers(model: onnx.ModelProto, starts: list[str]) -> list[onnx.NodeProto]:
    """The DynamicQuantizeLinear nodes of the main graph that read (transitively) any of `starts`."""
    reached, found = set(starts), []
    for node in model.graph.node:  # topologically sorted: one pass reaches everything downstream
        if not any(i in reached for i in node.input):
            continue
        reached.update(node.output)
        if node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx"):
            found.append(node)
    return found


def downstream_step(model: onnx.ModelProto, starts: list[str], feeds: list[dict]) -> float:
    """The largest run-time scale of a DynamicQuantizeLinear downstream of `starts` over `feeds` (0.0: none,
    the products run unquantized after the attention)."""
    quantizers = downstream_quantizers(model, starts)
    if not quantizers or not feeds:
        return 0.0
    scales = [q.output[1] for q in quantizers]
    probed = onnx.ModelProto()
    probed.CopyFrom(model)
    known = {o.name for o in probed.graph.output}
    probed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(s) for s in scales if s not in known)
    # the project's one session maker: weights left on disk found, a model past protobuf's limit opened from a
    # file, and the session counted in --timings
    session = ort_session(probed)
    inputs = {i.name for i in session.get_inputs()}
    step = 0.0
    for feed in feeds:
        values = session.run(scales, {k: v for k, v in feed.items() if k in inputs})
        step = max([step] + [float(np.max(v)) for v in values])
    return step
