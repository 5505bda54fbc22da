"""The ONNX Runtime (CPU) back end: any ONNX model, original, fused or a form model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from ..contract import form_record
from ..errors import TrtattnError
from ..host_memory import host_rss
from ..session import Session, TensorInfo


def numpy_dtype(ort_type: str) -> np.dtype:
    """ONNX Runtime's "tensor(float16)" -> numpy's float16 (bfloat16 and float8 from ml_dtypes), through
    Polygraphy's DataType and onnx's own map."""
    from polygraphy.datatype import DataType

    onnx_type = DataType.to_dtype(DataType.from_dtype(ort_type, "onnxruntime"), "onnx")
    if not isinstance(onnx_type, int):  # Polygraphy hands back what it does not know
        raise TrtattnError(f"ONNX Runtime tensor type {ort_type} has no numpy equivalent")
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))


# what the kv-cache forms write caches with: standard ONNX, and TensorRT's own op (`fuse --ops trt`)
CACHE_WRITES = {("", "ScatterND"), ("", "TensorScatter"), ("trt", "TRT_KVCacheUpdate")}


def trt_ops(model: onnx.ModelProto) -> bool:
    """Does the model hold TensorRT's own ONNX ops (trt::TRT_Attention, ... as `fuse --ops trt` writes)?"""
    return any(n.domain == "trt" for n in model.graph.node)


def graph_aliases(model: onnx.ModelProto) -> dict[str, str]:
    """Outputs that are a graph input updated in place: ScatterND / TensorScatter / TRT_KVCacheUpdate(cache input,
    ...) -> output, through Identity nodes (what the kv-cache form writes, and what TensorRT aliases)."""
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    producer = {o: n for n in model.graph.node for o in n.output}
    aliases = {}
    for name in outputs:
        node = producer.get(name)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        if node is not None and (node.domain.replace("ai.onnx", ""), node.op_type) in CACHE_WRITES \
                and node.input[0] in inputs:
            aliases[name] = node.input[0]
    return aliases


class OrtSession(Session):
    backend = "onnxruntime"

    def __init__(self, model, *, name: str | None = None, sidecar: dict | None = None, threads: int | None = None,
                 providers=("CPUExecutionProvider",)):
        import onnxruntime as ort

        from ..graph import io as onnxio

        if isinstance(model, (str, Path)):
            name = name or Path(model).stem
            model = onnxio.load(model)
        elif isinstance(model, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(model))
        elif not isinstance(model, onnx.ModelProto):
            raise TrtattnError(f"OrtSession takes an ONNX model (path, bytes or ModelProto), not {type(model).__name__}")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = int(threads)
        try:
            if trt_ops(model):  # TensorRT's ops run by trtattn_plugins' CPU kernels of their documented semantics
                import trtattn_plugins

                self.session = trtattn_plugins.Session(model, options=options, providers=providers)
            else:
                self.session = ort.InferenceSession(model.SerializeToString(), options, providers=list(providers))
        except Exception as e:
            raise TrtattnError(f"ONNX Runtime cannot load {name or 'the model'}: {str(e).splitlines()[0]}") from None
        inputs = [TensorInfo(i.name, numpy_dtype(i.type), tuple(-1 if d is None else d for d in i.shape))
                  for i in self.session.get_inputs()]
        outputs = [TensorInfo(o.name, numpy_dtype(o.type), tuple(-1 if d is None else d for d in o.shape))
                   for o in self.session.get_outputs()]
        aliases = graph_aliases(model)
        if sidecar and sidecar.get("io", {}).get("aliases"):
            aliases.update(sidecar["io"]["aliases"])
        super().__init__(name or model.graph.name or "model", inputs, outputs, aliases, sidecar)
        record = form_record(model)
        if record:  # a form model says what it reads as per-row lengths
            self.right_padded = tuple(record.get("right_padded") or ())
        self.model = model
        self._state: dict[str, np.ndarray] = {}

    # state lives on the host: assigning the returned array is the "in place" update
    def set_state(self, name, value):
        if name not in self._inputs:
            raise TrtattnError(f"{self.name}: no input named {name}")
        self._state[name] = self._cast(name, value)

    def get_state(self, name):
        return self._state[name].copy()

    def has_state(self, name):
        return name in self._state

    def state_shape(self, name):
        return tuple(self._state[name].shape)

    def _run(self, feeds, wanted, carry):
        full = {**{k: v for k, v in self._state.items() if k not in feeds}, **feeds}
        updates = {o: i for o, i in self.aliases.items() if i in self._state and i not in feeds}
        updates.update(carry)
        names = list(dict.fromkeys(list(wanted) + list(updates)))
        try:
            values = self.session.run(names, full)
        except Exception as e:
            raise TrtattnError(f"{self.name}: ONNX Runtime failed: {str(e).splitlines()[0]}") from None
        result = dict(zip(names, values))
        for out, inp in updates.items():
            self._state[inp] = result[out]
        return {k: result[k] for k in wanted}

    def memory(self):
        return {"kind": "host RSS", "bytes": host_rss()}
