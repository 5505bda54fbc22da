"""The recorded OnnxParser: an ONNX graph becomes one opaque layer (OnnxPart) whose inputs and outputs are network
tensors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import dtypes
from .objects import Recorded


class RecParserError(Recorded):
    def __init__(self, sim, code, desc, node=-1, node_name="", node_operator=""):
        super().__init__(sim, "ParserError")
        self._code, self._desc = code, desc
        self._node, self._node_name, self._node_operator = node, node_name, node_operator

    def _label(self):
        return f"{self._code.name}: {self._desc}"

    def __str__(self):
        return f"{self._code.name}: {self._desc}"

    def _m_code(self):
        return self._code

    def _m_desc(self):
        return self._desc

    def _m_file(self):
        return "trtsim"

    def _m_line(self):
        return 0

    def _m_func(self):
        return "parse"

    def _m_node(self):
        return self._node

    def _m_node_name(self):
        return self._node_name

    def _m_node_operator(self):
        return self._node_operator

    def _m_local_function_stack(self):
        return []

    def _m_local_function_stack_size(self):
        return 0


@dataclass
class OnnxPart:
    """A parsed ONNX model: the opaque layer's input i is graph input `inputs[i]`, output j is `outputs[j]`."""

    model: object  # onnx.ModelProto
    inputs: list[str]
    outputs: list[str]
    path: str | None = None
    input_types: dict = field(default_factory=dict)  # graph input name -> (DataType, dims)


class RecParser(Recorded):
    """OnnxParser: adds ONE opaque layer per parsed model (see the module docstring)."""

    def __init__(self, sim, network, logger):
        super().__init__(sim, "OnnxParser")
        self._net = network
        self._logger = logger
        self._errors: list[RecParserError] = []
        self._props["flags"] = 0

    def _error(self, code: str, message: str, node=-1, node_name="", node_operator=""):
        err = RecParserError(self._sim, self._sim.real.ErrorCode.__members__[code], message, node, node_name, node_operator)
        self._errors.append(err)
        self._sim.log_to(self._logger, "ERROR", f"ONNX parser: {message}")
        return False

    def _m_parse(self, model, path=None):
        import onnx

        try:
            proto = onnx.load_from_string(bytes(model))
            if path:
                from onnx.external_data_helper import load_external_data_for_model

                load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
        except Exception as error:  # noqa: BLE001 - the parser reports, it does not raise
            return self._error("MODEL_DESERIALIZE_FAILED", f"cannot read the model: {error}")
        return self._add_model(proto, path)

    def _m_parse_from_file(self, model):
        try:
            with open(model, "rb") as f:
                data = f.read()
        except OSError as error:
            return self._error("MODEL_DESERIALIZE_FAILED", f"cannot read {model}: {error}")
        return self._m_parse(data, model)

    def _add_model(self, proto, path) -> bool:
        import onnx

        real = self._sim.real
        graph = proto.graph
        if any(not o.type.tensor_type.HasField("shape") for o in graph.output):
            try:
                proto = onnx.shape_inference.infer_shapes(proto)
                graph = proto.graph
            except Exception:  # noqa: BLE001 - outputs without shapes are reported below
                pass
        initializers = {init.name for init in graph.initializer}
        inputs = [vi for vi in graph.input if vi.name not in initializers]

        def describe(vi):
            tensor_type = vi.type.tensor_type
            dtype = dtypes.from_onnx(real, tensor_type.elem_type)
            if dtype is None:
                return None, None, f"tensor '{vi.name}' has element type {tensor_type.elem_type}, which TensorRT does not support"
            if not tensor_type.HasField("shape"):
                return None, None, f"tensor '{vi.name}' has no shape (TensorRT needs the rank)"
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
            return dtype, dims, None

        described = {}
        for vi in list(inputs) + list(graph.output):
            dtype, dims, problem = describe(vi)
            if problem:
                return self._error("UNSUPPORTED_GRAPH", problem)
            described[vi.name] = (dtype, dims)
        existing = {t._name for t in self._net._inputs}
        clash = [vi.name for vi in inputs if vi.name in existing]
        if clash:
            return self._error("INVALID_GRAPH", f"the network already has inputs named {clash}")

        tensors = [self._net._new_input(vi.name, *described[vi.name]) for vi in inputs]
        part = OnnxPart(proto, [vi.name for vi in inputs], [vo.name for vo in graph.output], path,
                        {vi.name: described[vi.name] for vi in inputs})
        st = self._net._add_layer("ONNX", tensors, n_outputs=len(graph.output))
        st.onnx = part
        st.name = f"ONNX subgraph '{graph.name}'"
        for out, vo in zip(st.outputs, graph.output):
            out._name = vo.name
            out._dtype, dims = described[vo.name]
            out._shape = tuple(dims)
            self._net._m_mark_output(out)
        return True

    def _get_num_errors(self):
        return len(self._errors)

    def _m_get_error(self, index):
        index = int(index)
        return self._errors[index] if 0 <= index < len(self._errors) else None

    def _m_clear_errors(self):
        self._errors.clear()

    def _m_set_flag(self, flag):
        self._props["flags"] |= 1 << int(flag)

    def _m_clear_flag(self, flag):
        self._props["flags"] &= ~(1 << int(flag))

    def _m_get_flag(self, flag):
        return bool(self._props["flags"] >> int(flag) & 1)
