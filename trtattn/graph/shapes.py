"""Opsets, version conversion and shape inference: what the graph says about types and shapes.

Two inferences are combined: ONNX's own (with data propagation) and ONNX Runtime's symbolic shape
inference, which follows Reshape targets built from Shape/Gather/Concat (how TorchScript writes head
splits). Both run on the model's structure with its weights set aside.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import onnx
from onnx import version_converter

from ..errors import TrtattnError
from .io import attach_weights, scratch_dir, weights_aside
from .roles import dim_name

STANDARD_DOMAINS = ("", "ai.onnx")
DEFAULT_OPSET = 17


@dataclass
class Inferred:
    """What a GraphView reads of its tensors' shapes: name -> shape and name -> ONNX element type, and the shapes
    measured on the way (graph/measure.py: name -> each dim's sizes at the two probe runs, at the view's dims)."""

    shapes: dict[str, list] = field(default_factory=dict)
    types: dict[str, int] = field(default_factory=dict)
    measured: dict[str, list] = field(default_factory=dict)


def opset_of(model: onnx.ModelProto | onnx.GraphProto, default: int = 0) -> int:
    """The default-domain opset a model imports (the one opset reader)."""
    imports = getattr(model, "opset_import", ())
    return next((i.version for i in imports if i.domain in STANDARD_DOMAINS), default)


def upgrade_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    """ONNX's version converter; where it refuses the model (ONNX Runtime's own ops in the default domain, such as
    its LayerNormalization below opset 17, which it has no schema for; contrib ops it cannot infer types through),
    node by node with ONNX's own adapters (graph/upgrade.py); onnxscript's converter last (it keeps attributes an
    op moved to inputs, such as ReduceMean's axes at 18, so its result is not taken first)."""
    if opset_of(model) >= version:
        return model
    try:
        with weights_aside(model) as weights:  # the converter serializes the model: convert its structure
            converted = version_converter.convert_version(model, version)
        attach_weights(converted, weights)
    except Exception:  # the converters' errors share no base class
        from .upgrade import upgrade_by_node

        try:
            with weights_aside(model) as weights:
                converted = upgrade_by_node(model, opset_of(model), version)
            attach_weights(converted, weights)
        except TrtattnError as by_node:
            try:
                import onnx_ir as ir
                from onnxscript import version_converter as ir_converter

                ir_model = ir.from_proto(model)
                ir_converter.convert_version(ir_model, version, fallback=False)
                converted = ir.to_proto(ir_model)
            except Exception:
                raise by_node from None
    # the converters keep the IR version: an IR 3 model (opset 7) at opset 23 would be invalid, and under
    # IR 3 an initializer that is not also a graph input has no type
    needed = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", version)])
    converted.ir_version = max(converted.ir_version, needed)
    return converted


def dims_of(value_info: onnx.ValueInfoProto) -> list | None:
    """A tensor's shape as ints (static), dim names (symbolic) or None (unknown); None without a shape."""
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.tensor_type.shape.dim]


def infer(model: onnx.ModelProto, symbolic: bool = True) -> list[onnx.ModelProto]:
    """The model with inferred value_info, by each inference that succeeds: ONNX's, then (`symbolic`) ONNX
    Runtime's symbolic one where ONNX's leaves dims it could not name (it names them unk__N: TorchScript's
    head splits; dynamo exports have none, and skipping it saves importing sympy, 1.5 s). The weights are
    set aside while they run."""
    results: list[onnx.ModelProto] = []
    with weights_aside(model):
        for inference in (_onnx_shapes, symbolic_shapes) if symbolic else (_onnx_shapes,):
            if results and not _unnamed_dims(results[-1]):
                break
            try:
                inferred = inference(model)
            except Exception:
                continue
            if inferred is not None:
                results.append(inferred)
    return results


def unnamed(dims: list | None) -> bool:
    """Whether a shape is missing or has a dim an inference could not name (None, or unk__N)."""
    return dims is None or any(d is None or (isinstance(d, str) and d.startswith("unk__")) for d in dims)


def left_unnamed(inferred: list[onnx.ModelProto]) -> bool:
    """Whether `infer`'s results leave a dim unnamed: none succeeded, or the last left a tensor without a shape
    or with an unk__N dim (where `infer` goes on to the symbolic inference)."""
    return not inferred or _unnamed_dims(inferred[-1])


def _unnamed_dims(inferred: onnx.ModelProto) -> bool:
    """Whether an inference left a tensor without a shape or a dim it could only call unk__N."""
    shaped = set()
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = dims_of(vi)
        if unnamed(dims):
            return True
        shaped.add(vi.name)
    inputs = {i.name for i in inferred.graph.input} | {t.name for t in inferred.graph.initializer}
    return any(o not in shaped and o not in inputs for n in inferred.graph.node for o in n.output if o)


def known_shapes(model: onnx.ModelProto) -> dict[str, list]:
    """name -> shape, keeping for each tensor the most static shape any inference found."""
    return known_shapes_and_types(model)[0]


def known_shapes_and_types(model: onnx.ModelProto) -> tuple[dict[str, list], dict[str, int]]:
    """name -> shape as known_shapes, and name -> ONNX element type, from one run of the inferences."""
    return merged(infer(model))


def merged(inferences: list[onnx.ModelProto]) -> tuple[dict[str, list], dict[str, int]]:
    """name -> the most static shape any of `inferences` (infer's results) found, and name -> the ONNX element
    type the first that has one gives."""
    shapes: dict[str, list] = {}
    types: dict[str, int] = {}
    for inferred in inferences:
        g = inferred.graph
        for vi in list(g.value_info) + list(g.input) + list(g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types.setdefault(vi.name, vi.type.tensor_type.elem_type)
            shape = dims_of(vi)
            if shape is None:
                continue
            known = shapes.get(vi.name)
            if known is None or sum(isinstance(d, int) for d in shape) > sum(isinstance(d, int) for d in known):
                shapes[vi.name] = shape
    return shapes, types


def tensor_types(model: onnx.ModelProto) -> dict[str, tuple[int, list | None]]:
    """name -> (ONNX elem type, shape with ints / dim names / None), from ONNX's shape inference."""
    try:
        with weights_aside(model):
            inferred = _onnx_shapes(model)
    except Exception:
        inferred = model
    out = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if v.type.HasField("tensor_type"):
            out[v.name] = (v.type.tensor_type.elem_type, dims_of(v))
    for init in model.graph.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    return out


def _onnx_shapes(model):
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def symbolic_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic shape inference through its public entry point, keeping what it inferred
    even when it could not infer everything: it then saves its partial result as
    sym_shape_infer_temp.onnx in the working directory, with every tensor over 1 KB in external data
    files beside it, and raises; so it runs in a scratch directory on the model's structure (the weights
    set aside), and the result holds the model's own weights, not references to files that are gone."""
    inference = _symbolic_module().SymbolicShapeInference
    model = _shape_stand_ins(model)
    here = os.getcwd()
    with weights_aside(model) as weights, scratch_dir("shapes") as scratch:
        structure, moved = _weights_as_inputs(model, weights)
        os.chdir(scratch)
        try:
            inferred = inference.infer_shapes(structure, auto_merge=True, guess_output_rank=True)
        except Exception:
            partial = os.path.join(scratch, "sym_shape_infer_temp.onnx")
            inferred = onnx.load(partial, load_external_data=False) if os.path.exists(partial) else None
            if inferred is not None:
                _read_back(inferred, scratch)
        finally:
            os.chdir(here)
    if inferred is not None:
        _inputs_back_to_weights(inferred, model, moved)
        attach_weights(inferred, weights)
    return inferred


def proven_output_dims(model: onnx.ModelProto, names: set[str]) -> dict[str, list]:
    """Output name -> its dims where ONNX Runtime's symbolic shape inference derives them from the inputs' dims,
    the declared output shapes set aside: a dim is its name in `names` (the inputs' dim names) where the
    inference proves the two equal, else None. An exporter names an output's dims after the op that makes
    them ('Mullast_hidden_state_dim_1', which is the inputs' 'seq'); ONNX's own inference does not follow
    TorchScript's shape arithmetic (unk__N). Nothing runs when every declared output dim is a static size
    or already one of `names`, and nothing is proven when the inference cannot run."""
    outputs = [o for o in model.graph.output if any(isinstance(d, str) and d not in names for d in dims_of(o) or ())]
    if not outputs:
        return {}
    declared = [onnx.TensorShapeProto() for _ in outputs]
    for o, shape in zip(outputs, declared):  # set aside only while the inference runs: the model is given back as read
        shape.CopyFrom(o.type.tensor_type.shape)
        o.type.tensor_type.ClearField("shape")
    try:
        inferred = symbolic_shapes(model)
    finally:
        for o, shape in zip(outputs, declared):
            o.type.tensor_type.shape.CopyFrom(shape)
    if inferred is None:
        return {}
    wanted = {o.name for o in outputs}
    return {o.name: [_input_dim(d, names) for d in dims] for o in inferred.graph.output
            if o.name in wanted and (dims := dims_of(o)) is not None}


def _input_dim(dim, names: set[str]) -> str | None:
    """The inputs' dim a symbolic dim is ('past + seq' is an input's 'past+seq'), or None."""
    name = dim.replace(" ", "") if isinstance(dim, str) else None
    return name if name in names else None


def _weights_as_inputs(model: onnx.ModelProto, weights: dict[str, bytes]) -> tuple[onnx.ModelProto, set[str]]:
    """A structure-only copy in which the main graph's initializers set aside are typed, shaped graph
    inputs. ONNX Runtime's inference reads the value of any initializer an op passes on (Reshape,
    Squeeze, Concat: to follow shape arithmetic), and one set aside has no value, so it gave up on the
    whole model (tf2onnx reshapes weights). As inputs, their shapes are known and nothing reads their
    values; what shape arithmetic reads is small and stays in place (weights_aside's threshold)."""
    moved = {t.name for t in model.graph.initializer if t.name in weights}
    if not moved:
        return model, moved
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the caller has set the weights aside: this copies the structure only
    declared = {i.name for i in copy.graph.input}
    kept = [t for t in copy.graph.initializer if t.name not in moved]
    for t in copy.graph.initializer:
        if t.name in moved and t.name not in declared:
            copy.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    return copy, moved


def _inputs_back_to_weights(inferred: onnx.ModelProto, model: onnx.ModelProto, moved: set[str]) -> None:
    """Undo _weights_as_inputs on the inferred copy: the model's initializers (still without their data,
    attach_weights gives it back) in the model's order, and only the model's own inputs."""
    if not moved:
        return
    own_inputs = {i.name for i in model.graph.input}
    inputs = [i for i in inferred.graph.input if i.name not in moved or i.name in own_inputs]
    del inferred.graph.input[:]
    inferred.graph.input.extend(inputs)
    present = {t.name: t for t in inferred.graph.initializer}
    ordered = [present.get(t.name, t) for t in model.graph.initializer if t.name in present or t.name in moved]
    del inferred.graph.initializer[:]
    inferred.graph.initializer.extend(ordered)


def _read_back(model: onnx.ModelProto, folder: str) -> None:
    """Read into the proto every tensor whose external data file is in `folder` (the small tensors the
    partial result wrote out; the weights set aside name no file there)."""
    from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor, uses_external_data

    from .external import all_tensors

    for t in all_tensors(model):
        if uses_external_data(t) and os.path.exists(os.path.join(folder, ExternalDataInfo(t).location)):
            load_external_data_for_tensor(t, folder)
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]


# Every Reduce op shares one shape rule (axes, keepdims, noop_with_empty_axes); ONNX Runtime's symbolic
# inference reads axes given as an input (opset 18+) only for ReduceSum and ReduceMean. For any other, it
# leaves the output without a shape and then fails on the first Add/Sub/Mul/Div reading it, on the whole
# model and with no partial result: one layer's softmax written as Exp(x - ReduceMax(x)) / ReduceSum took
# the dims of every other layer with it (issue 18, class 10). Shapes are inferred with those reductions
# standing in as ReduceSum, which has the same output shape by definition.
_SAME_SHAPE_AS_REDUCE_SUM = ("ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp", "ReduceLogSum",
                             "ReduceL1", "ReduceL2", "ReduceSumSquare")


def _anonymous_dims(model: onnx.ModelProto):
    """(dim, name) for each input dim written -1, '?' or '' (paddle2onnx, tf2onnx): ONNX Runtime's
    inference takes -1 for a size, so the shape a Reshape gets from Shape(input_ids) has two -1s and it
    gives up on the whole model (an assertion). They stand in under roles.py's name for their place."""
    for vi in model.graph.input:
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            name = dim_name(d, vi.name, axis)
            if isinstance(name, str) and name != (d.dim_param if d.HasField("dim_param") else None):
                yield d, name


def _shape_stand_ins(model: onnx.ModelProto) -> onnx.ModelProto:
    """A structure-only copy for shape inference, with reductions by an axes input written as ReduceSum
    and anonymous input dims named."""
    def reductions(g: onnx.GraphProto):
        for n in g.node:
            if n.op_type in _SAME_SHAPE_AS_REDUCE_SUM and n.domain in STANDARD_DOMAINS and len(n.input) > 1:
                yield n
            for attr in n.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from reductions(attr.g)

    if next(reductions(model.graph), None) is None and next(_anonymous_dims(model), None) is None:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the caller has set the weights aside: this copies the structure only
    for n in reductions(copy.graph):
        n.op_type = "ReduceSum"
    for d, name in list(_anonymous_dims(copy)):
        d.Clear()
        d.dim_param = name
    return copy


_SYMBOLIC = None


def _symbolic_module():
    """onnxruntime/tools/symbolic_shape_infer.py, loaded on its own: importing it as
    onnxruntime.tools.symbolic_shape_infer runs the package's __init__, which imports torch
    (a second and 250 MB on every call of trtattn where torch is installed)."""
    global _SYMBOLIC
    if _SYMBOLIC is None:
        import importlib.util

        import onnxruntime

        path = os.path.join(os.path.dirname(onnxruntime.__file__), "tools", "symbolic_shape_infer.py")
        spec = importlib.util.spec_from_file_location("trtattn_symbolic_shape_infer", path)
        if spec is None or spec.loader is None:  # onnxruntime's layout changed: say which file
            raise ImportError(f"cannot load ONNX Runtime's symbolic shape inference from {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SYMBOLIC = module
    return _SYMBOLIC
