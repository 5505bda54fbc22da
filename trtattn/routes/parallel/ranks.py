"""Each rank's form: the original model with its weights sliced, the shapes it builds divided where they
are constants, and the collectives explicit as nodes of the `trtattn.dist` domain:

    AllReduce(x) -> y      (reduce="sum", ranks=N): the partial sums of a product split by rows, or of an
                           embedding lookup split by vocabulary
    AllGather(x) -> y      (axis=a, ranks=N): a sharded graph output, ranks' slices concatenated along a

These are what the builder lowers to `add_dist_collective` (ALL_REDUCE / ALL_GATHER); ONNX Runtime has
no kernel for them, so collectives.py runs a rank set by cutting its forms at these nodes.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph import external
from ...graph.shapes import tensor_types
from ...graph.view import export_graph, mapped_constant
from .facts import constant_value
from .find import ParallelPlan
from .shard import Shard

DOMAIN = "trtattn.dist"
OPS = ("AllReduce", "AllGather")


def slice_array(value: np.ndarray, shard: Shard, ranks: int, rank: int) -> np.ndarray:
    """Rank `rank`'s block of `value` along `shard`."""
    shape, a, blocks = value.shape, shard.axis, shard.blocks(ranks)
    view = value.reshape(shape[:a] + (shard.outer, blocks, shape[a] // (shard.outer * blocks)) + shape[a + 1:])
    part = np.take(view, shard.block_of(rank), axis=a + 1)
    return np.ascontiguousarray(part.reshape(shape[:a] + (shape[a] // blocks,) + shape[a + 1:]))


def in_memory(name: str, value: np.ndarray) -> gs.Constant:
    return gs.Constant(name, value)


def on_disk(data: external.DataWriter):
    """A rank's weights written to `data` as they are made (each then read from there, if at all)."""
    return lambda name, value: mapped_constant(name, data.tensor(name, value), data.folder)


def rank_model(plan: ParallelPlan, like: onnx.ModelProto, rank: int, store=in_memory) -> onnx.ModelProto:
    """Rank `rank`'s form. `store(name, array)` makes the Constant of each weight the rank slices (in the
    proto by default; `on_disk(data)` writes it to a data file at once: one weight in memory at a time)."""
    n, split = plan.ranks, plan.split
    graph = plan.graph.copy()
    nodes = list(graph.nodes)
    made: dict[tuple, gs.Tensor] = {}

    def constant(t: gs.Tensor, shard: Shard) -> gs.Tensor:
        key = (t.name, shard)
        if key not in made:
            whole = external.own_mapping(np.asarray(constant_value(t)))
            made[key] = store(f"{t.name}.rank{rank}of{n}", slice_array(whole, shard, n, rank))
        return made[key]

    for (i, k), shard in split.constant_slices.items():
        nodes[i].inputs[k] = constant(nodes[i].inputs[k], shard)
    for (i, k), entries in split.shape_fixes.items():
        t = nodes[i].inputs[k]
        value = constant_value(t)
        if value is not None:
            fixed = np.array(value, copy=True).reshape(-1)
            for entry, divisor in entries.items():
                fixed[entry] //= divisor
            nodes[i].inputs[k] = gs.Constant(f"{t.name}.rank_shape{i}", fixed.astype(value.dtype))
        else:  # computed: divide the static entries on the rank
            divisors = np.ones(len(plan.facts.values[t.name].reshape(-1)), dtype=np.int64)
            divisors[list(entries)] = list(entries.values())
            out = gs.Variable(f"{t.name}.rank_shape{i}", dtype=np.int64)
            graph.nodes.append(gs.Node("Div", f"{nodes[i].name}/rank_shape", inputs=[t, gs.Constant(
                f"{out.name}.divisor", divisors)], outputs=[out]))
            nodes[i].inputs[k] = out
    def sliced(i: int, k: int, axis: int, part: int, block: int, tag: str) -> None:
        """Input k of node i read through a Slice of `part` along `axis` at block `block` (one per tensor)."""
        t = nodes[i].inputs[k]
        key = (t.name, axis, part, block)
        if key not in made:
            made[key] = gs.Variable(f"{t.name}.rank{rank}of{n}.{tag}{axis}", dtype=t.dtype)
            bounds = [gs.Constant(f"{made[key].name}.{what}", np.array([v], dtype=np.int64)) for what, v in
                      (("starts", block * part), ("ends", (block + 1) * part), ("axes", axis))]
            graph.nodes.append(gs.Node("Slice", f"{nodes[i].name}/rank_{tag}{k}", inputs=[t, *bounds],
                                       outputs=[made[key]]))
        nodes[i].inputs[k] = made[key]

    for (i, k), shard in split.activation_slices.items():  # an operand computed whole: the rank's block
        size = plan.facts.shapes[nodes[i].inputs[k].name][shard.axis]
        sliced(i, k, shard.axis, size // shard.blocks(n), shard.block_of(rank), "axis")
    for (i, k), (shard, copies) in split.narrowed.items():  # replicated heads: those of the rank's block
        size = plan.facts.shapes[nodes[i].inputs[k].name][shard.axis]
        sliced(i, k, shard.axis, size * copies // n, (rank % shard.copies) // copies, "narrow")
    for (i, k), (component, block, copies) in split.index_shifts.items():  # the rank's indices into its own block
        t = nodes[i].inputs[k]
        shifted = (t.name, "shift", component)
        if shifted not in made:
            depth = plan.facts.shapes[plan.nodes[i].inputs[k].name][-1]
            shift = np.zeros(depth, dtype=plan.facts.dtypes[plan.nodes[i].inputs[k].name])
            shift[component] = rank // copies * block
            made[shifted] = gs.Variable(f"{t.name}.local", dtype=t.dtype)
            graph.nodes.append(gs.Node("Sub", f"{nodes[i].name}/rank_indices", inputs=[t, gs.Constant(
                f"{made[shifted].name}.shift", shift)], outputs=[made[shifted]]))
        nodes[i].inputs[k] = made[shifted]
    for i, attrs in split.head_attrs.items():
        for attr, by in attrs:
            nodes[i].attrs[attr] = nodes[i].attrs[attr] // by
    for t in graph.inputs:
        if t.name in split.input_shards:
            t.shape = _divided(t.shape, split.input_shards[t.name], n)
    whole = tensor_types(like)  # an ALL_REDUCE's output has the whole model's shape: TensorRT needs its rank
    for i in split.vocab:
        _vocabulary_lookup(graph, nodes[i], rank, n, plan.facts.dtypes, made, store)
    for i in split.rows + split.vocab:
        out = nodes[i].outputs[0]
        bias = nodes[i].inputs[2] if i in split.bias_after else None
        if bias is not None:  # a Gemm's bias: added once, after the ALL_REDUCE
            beta = float(nodes[i].attrs.get("beta", 1.0))
            nodes[i].inputs.pop(2)
        _collective(graph, nodes[i], "AllReduce", n, plan.facts.dtypes, reduce="sum")
        shape = whole.get(out.name, (None, None))[1] or [None] * len(plan.facts.shapes[out.name])
        out.shape = [d if d is not None else f"{out.name}_dim{k}" for k, d in enumerate(shape)]
        if bias is not None:
            reduced = gs.Variable(f"{out.name}/reduced", dtype=out.dtype, shape=list(out.shape))
            out.inputs[0].outputs[0] = reduced
            value = np.asarray(constant_value(bias))
            bias = bias if beta == 1.0 else gs.Constant(f"{bias.name}.beta", (value * beta).astype(value.dtype))
            graph.nodes.append(gs.Node("Add", f"{nodes[i].name}/bias", inputs=[reduced, bias], outputs=[out]))
    outputs = {t.name: t for t in graph.outputs}
    for name, shard in split.gathered.items():
        _collective(graph, outputs[name].inputs[0], "AllGather", n, plan.facts.dtypes, output=outputs[name],
                    axis=shard.axis)
    for name, shard in split.cached.items():
        outputs[name].shape = _divided(outputs[name].shape, shard, n)
    return _exported(graph, like, rank, n)


def _exported(graph: gs.Graph, like: onnx.ModelProto, rank: int, ranks: int) -> onnx.ModelProto:
    """The rank's graph as a model: the intermediate shapes dropped (the rank's differ from the whole
    model's; ONNX Runtime infers them), `like`'s metadata kept and the rank recorded."""
    keep = {t.name for t in list(graph.inputs) + list(graph.outputs)}
    keep |= {t.name for node in graph.nodes if node.domain == DOMAIN for t in node.outputs}  # shaped by the caller
    for t in graph.tensors().values():
        if isinstance(t, gs.Variable) and t.name not in keep:
            t.shape = None
    graph.cleanup().toposort()
    model = export_graph(graph, like, do_type_check=False)
    model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    for prop in like.metadata_props:
        model.metadata_props.add(key=prop.key, value=prop.value)
    model.metadata_props.add(key="trtattn.rank", value=f"{rank}/{ranks}")
    return model


def _vocabulary_lookup(graph: gs.Graph, node: gs.Node, rank: int, ranks: int, dtypes: dict, made: dict,
                       store=in_memory) -> None:
    """Gather(table, ids) on rank r: its rows [r*P, (r+1)*P) and one row of zeros after them; ids outside its
    rows look up the zeros, so the ranks' lookups sum (ALL_REDUCE) to the whole table's."""
    table = external.own_mapping(np.asarray(constant_value(node.inputs[0])))
    part = table.shape[0] // ranks
    key = (node.inputs[0].name, "vocabulary")
    if key not in made:  # one rank table for every lookup of a shared table (BART's encoder and decoder)
        rows = np.concatenate([table[rank * part:(rank + 1) * part], np.zeros((1,) + table.shape[1:], table.dtype)])
        made[key] = store(f"{node.inputs[0].name}.rank{rank}of{ranks}.vocabulary", rows)
    ids = node.inputs[1]
    kind = np.dtype(dtypes[ids.name])
    base = f"{node.name}/rank{rank}of{ranks}"

    def op(name, kind_of, inputs, dtype=kind):
        out = gs.Variable(f"{base}/{name}", dtype=dtype)
        graph.nodes.append(gs.Node(kind_of, f"{base}/{name}", inputs=inputs, outputs=[out]))
        return out

    const = lambda name, v: gs.Constant(f"{base}/{name}", np.asarray(v, dtype=kind))  # noqa: E731
    local = op("local_ids", "Sub", [ids, const("first", rank * part)])
    inside = op("inside", "And", [op("above", "GreaterOrEqual", [local, const("zero", 0)], bool),
                                  op("below", "Less", [local, const("rows", part)], bool)], bool)
    node.inputs[1] = op("ids", "Where", [inside, local, const("zeros_row", part)])
    node.inputs[0] = made[key]


def _collective(graph: gs.Graph, node: gs.Node, kind: str, ranks: int, dtypes: dict,
                output: gs.Tensor | None = None, **attrs) -> None:
    """Put the collective `kind` on `node`'s output (or on `output` of it): the node writes a local tensor the op reads."""
    out = output if output is not None else node.outputs[0]
    out.dtype = out.dtype or dtypes[out.name]  # typed: the cut at collectives makes it an input
    local = gs.Variable(f"{out.name}/local", dtype=out.dtype)
    for reader in list(out.outputs) if output is not None else ():  # a gathered output read inside: its slice
        for k, t in enumerate(list(reader.inputs)):
            if t is out:
                reader.inputs[k] = local
    node.outputs[node.outputs.index(out)] = local
    graph.nodes.append(gs.Node(kind, f"{node.name}/{kind}", attrs={**attrs, "ranks": ranks}, inputs=[local],
                               outputs=[out], domain=DOMAIN))


def _divided(shape, shard: Shard, ranks: int):
    if shape is None:
        return None
    shape, axis = list(shape), shard.axis
    if isinstance(shape[axis], (int, np.integer)) and shape[axis] > 0:
        shape[axis] //= shard.blocks(ranks)
    return shape
