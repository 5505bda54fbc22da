"""TensorRT's own ONNX attention ops, as data: names, attribute types, defaults, allowed values,
inputs in order (which are optional, which dtypes) and the documented restrictions.

Source: onnx/onnx-tensorrt docs/TRT_custom_ops.md (the version that documents `causal_kind` and
packed forms for both attention ops; plugins/README.md says which fact comes from where).
`check_node` reports every way a node departs from that document, so a writer of these ops and a
test of a written model use the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

DOMAIN = "trt"  # the doc names no domain; NVIDIA's TensorRT-Edge-LLM writes trt::TRT_Attention

FORMS = ("padded_bhnd", "packed_nhd")
FLOATS = ("float32", "float16", "bfloat16")

# normalization_quantize_to_type holds an ONNX TensorProto data type (the parser converts it with
# its ONNX -> TensorRT dtype table); UNDEFINED (or absent) means the documented default, FP8.
FP8 = onnx.TensorProto.FLOAT8E4M3FN
INT8 = onnx.TensorProto.INT8
UNDEFINED = onnx.TensorProto.UNDEFINED


@dataclass(frozen=True)
class Attribute:
    name: str
    type: str  # "INT", "FLOAT" or "STRING" (onnx.AttributeProto type names)
    default: object = None  # None: the doc gives no default (absent = not set)
    allowed: tuple | None = None  # None: any value of the type
    doc: str = ""


@dataclass(frozen=True)
class Input:
    name: str
    optional: bool
    dtypes: tuple[str, ...]
    doc: str = ""


@dataclass(frozen=True)
class OpSchema:
    op_type: str
    attributes: tuple[Attribute, ...]
    inputs: tuple[Input, ...]
    restrictions: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ("Y",)
    domain: str = DOMAIN

    def attribute(self, name: str) -> Attribute | None:
        return next((a for a in self.attributes if a.name == name), None)

    def index(self, name: str) -> int:
        return next(i for i, x in enumerate(self.inputs) if x.name == name)

    @property
    def min_inputs(self) -> int:
        return max(i for i, x in enumerate(self.inputs) if not x.optional) + 1


_FORM_DOC = '"padded_bhnd" [B, H, N, D] or "packed_nhd" [T, H, D]'
_Q_LENGTHS = Input("query_lengths", True, ("int32",),
                   "[B+1] cumulative token counts from 0; required when query_form is packed_nhd")
_KV_LENGTHS = Input("kv_lengths", True, ("int32",),
                    "packed_nhd: [B+1] cumulative (required); padded_bhnd: [B] per-row lengths (optional)")
_MASK = Input("attn_mask", True, ("bool",) + FLOATS,
              "rank <= 4; BOOL: True may attend; any other dtype is added to the BMM1 output")
_QKV = tuple(Input(n, False, FLOATS) for n in ("Q", "K", "V"))
_DECOMPOSABLE = Attribute("TRT_decomposable", "INT", 0, (0, 1),
                          "1: TensorRT may split the attention into several kernels when none fuses it")
_NORMALIZATION = Attribute("TRT_normalization_op", "STRING", "softmax", ("softmax", "none"))

TRT_ATTENTION = OpSchema(
    "TRT_Attention",
    attributes=(
        Attribute("query_form", "STRING", "padded_bhnd", FORMS, "IO form of Q and Y: " + _FORM_DOC),
        Attribute("kv_form", "STRING", "padded_bhnd", FORMS, "IO form of K and V: " + _FORM_DOC),
        Attribute("causal_kind", "STRING", "none", ("none", "upper_left", "lower_right")),
        _DECOMPOSABLE,
        _NORMALIZATION,
        Attribute("nb_rank", "INT", 1, None, "number of ranks for multi-device attention"),
    ),
    inputs=_QKV + (_MASK, _Q_LENGTHS, _KV_LENGTHS),
    restrictions=(
        "Q, K and V already match the IO forms: no q_num_heads, kv_num_heads or scale (Q is pre-scaled)",
        "attn_mask cannot be used together with a causal_kind other than none",
        "attn_mask is not supported when query_form is packed_nhd",
        "query_lengths must be given when query_form is packed_nhd",
        "kv_lengths must be given when kv_form is packed_nhd",
    ),
)

TRT_QUANTIZED_ATTENTION = OpSchema(
    "TRT_QuantizedAttention",
    attributes=(
        TRT_ATTENTION.attributes[0],
        TRT_ATTENTION.attributes[1],
        # The next four follow ONNX Attention-23's rules (the doc says so and gives no more).
        Attribute("is_causal", "INT", 0, (0, 1), "Attention-23: upper-left causal mask"),
        Attribute("kv_num_heads", "INT", None, None, "Attention-23: heads of 3-D [B, S, hidden] K/V"),
        Attribute("q_num_heads", "INT", None, None, "Attention-23: heads of a 3-D [B, S, hidden] Q"),
        Attribute("scale", "FLOAT", None, None, "Attention-23: applied to Q K^T; default 1/sqrt(head size)"),
        Attribute("normalization_quantize_to_type", "INT", FP8, (UNDEFINED, FP8, INT8),
                  "fp8 (default) or int8 Q/DQ between normalization and BMM2, as an ONNX TensorProto type"),
        _DECOMPOSABLE,
        _NORMALIZATION,
    ),
    inputs=_QKV + (
        _MASK,
        Input("normalization_quantize_scale", True, FLOATS, "scalar Q/DQ scale between normalization and BMM2"),
        _Q_LENGTHS,
        _KV_LENGTHS,
    ),
    restrictions=(
        "Q, K and V are the dequantized (DequantizeLinear) tensors; their Q/DQ are ordinary ONNX nodes",
        "normalization_quantize_scale must be given (the doc lists 5-7 inputs)",
        "attn_mask cannot be used together with is_causal (IAttention rejects a mask with a causal kind)",
        "attn_mask is not supported when query_form is packed_nhd",
        "query_lengths must be given when query_form is packed_nhd",
        "kv_lengths must be given when kv_form is packed_nhd",
    ),
)

TRT_KV_CACHE_UPDATE = OpSchema(
    "TRT_KVCacheUpdate",
    attributes=(
        Attribute("update_form", "STRING", "padded_bhnd", FORMS, "IO form of the update: " + _FORM_DOC),
        Attribute("mode", "STRING", "linear", ("linear",)),
        Attribute("axis", "INT", -2, (-2,), "the sequence axis of the [B, H, N, D] cache"),
    ),
    inputs=(
        Input("past_cache", False, FLOATS, "[B, H, N, D]"),
        Input("update", False, FLOATS, "[B, H, S, D] padded or [T, H, D] packed"),
        Input("write_indices", True, ("int32",), "[B]"),
        Input("update_lengths", True, ("int32",), "[B+1] cumulative token counts of the update"),
    ),
    restrictions=(
        "past_cache is always 4-D [B, H, N, D]",
        "update is 4-D for padded_bhnd, 3-D for packed_nhd",
        "update_lengths must be given when update_form is packed_nhd",
    ),
)

OPS: dict[str, OpSchema] = {s.op_type: s for s in (TRT_ATTENTION, TRT_QUANTIZED_ATTENTION, TRT_KV_CACHE_UPDATE)}

_ATTR_TYPES = {"INT": onnx.AttributeProto.INT, "FLOAT": onnx.AttributeProto.FLOAT,
               "STRING": onnx.AttributeProto.STRING}


def attributes(node: onnx.NodeProto) -> dict[str, object]:
    """The node's attributes as Python values, with the documented defaults filled in."""
    schema = OPS[node.op_type]
    values = {a.name: a.default for a in schema.attributes if a.default is not None}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        values[attr.name] = value.decode() if isinstance(value, bytes) else value
    return values


def present_inputs(node: onnx.NodeProto) -> dict[str, str]:
    """Documented input name -> tensor name, for the inputs the node gives (not empty)."""
    schema = OPS[node.op_type]
    return {schema.inputs[i].name: t for i, t in enumerate(node.input[:len(schema.inputs)]) if t}


def check_node(node: onnx.NodeProto) -> list[str]:
    """Every way this node departs from the documented op (empty: it conforms)."""
    where = f"{node.op_type} node '{node.name or '<unnamed>'}'"
    schema = OPS.get(node.op_type)
    if schema is None:
        return [f"{where}: not a documented TensorRT op (known: {', '.join(OPS)})"]
    problems = []
    if node.domain != schema.domain:
        problems.append(f"{where}: domain '{node.domain}', the TensorRT parser's ops are in '{schema.domain}'")
    for attr in node.attribute:
        spec = schema.attribute(attr.name)
        if spec is None:
            problems.append(f"{where}: attribute '{attr.name}' is not documented for {schema.op_type} "
                            f"(documented: {', '.join(a.name for a in schema.attributes)})")
        elif attr.type != _ATTR_TYPES[spec.type]:
            got = onnx.AttributeProto.AttributeType.Name(attr.type)
            problems.append(f"{where}: attribute '{attr.name}' is {got}, the doc says {spec.type}")
        else:
            value = onnx.helper.get_attribute_value(attr)
            value = value.decode() if isinstance(value, bytes) else value
            if spec.allowed is not None and value not in spec.allowed:
                problems.append(f"{where}: {attr.name}={value!r} is not one of {list(spec.allowed)}")
            elif spec.type == "INT" and spec.allowed is None and isinstance(value, int) and value < 1:
                problems.append(f"{where}: {attr.name}={value} must be positive")
    count = len(node.input)
    if count > len(schema.inputs):
        problems.append(f"{where}: {count} inputs, the doc lists at most {len(schema.inputs)} "
                        f"({', '.join(i.name for i in schema.inputs)})")
    for index, input_spec in enumerate(schema.inputs):
        if not input_spec.optional and (index >= count or not node.input[index]):
            problems.append(f"{where}: required input {index} '{input_spec.name}' is missing")
    if len(node.output) != 1 or not node.output[0]:
        problems.append(f"{where}: {len(node.output)} outputs, the doc has exactly one (Y)")
    if not problems:
        problems += _restrictions(schema, attributes(node), set(present_inputs(node)), where)
    return problems


def _restrictions(schema: OpSchema, attrs: dict, given: set[str], where: str) -> list[str]:
    problems = []
    if schema is TRT_KV_CACHE_UPDATE:
        if attrs["update_form"] == "packed_nhd" and "update_lengths" not in given:
            problems.append(f"{where}: update_form packed_nhd needs update_lengths")
        return problems
    if schema is TRT_QUANTIZED_ATTENTION and "normalization_quantize_scale" not in given:
        problems.append(f"{where}: normalization_quantize_scale (input 4) is missing")
    causal = attrs.get("causal_kind", "none") != "none" or attrs.get("is_causal", 0) == 1
    if "attn_mask" in given and causal:
        problems.append(f"{where}: attn_mask cannot be used together with a causal mask")
    if "attn_mask" in given and attrs["query_form"] == "packed_nhd":
        problems.append(f"{where}: attn_mask is not supported when query_form is packed_nhd")
    if attrs["query_form"] == "packed_nhd" and "query_lengths" not in given:
        problems.append(f"{where}: query_form packed_nhd needs query_lengths")
    if attrs["kv_form"] == "packed_nhd" and "kv_lengths" not in given:
        problems.append(f"{where}: kv_form packed_nhd needs kv_lengths")
    return problems


def check_model(model: onnx.ModelProto) -> list[str]:
    """check_node for every node of the model (and its subgraphs) that is in the trt domain or is
    named like one of these ops."""
    problems = []
    for node in all_nodes(model.graph):
        if node.domain == DOMAIN or node.op_type in OPS:
            problems += check_node(node)
    return problems


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The node's graph attributes (If branches, Loop and Scan bodies)."""
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]


def all_nodes(graph: onnx.GraphProto):
    """Every node of the graph and of its subgraphs, depth first."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)
