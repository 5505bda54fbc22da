"""Each rank's network for TensorRT: the rank form cut at its `trtattn.dist` nodes (trt/cut.py), parsed by
the ONNX parser, each collective lowered to an IDistCollectiveLayer (trt/lower.py, CollectivePlan).

    plan, cut_model = rank_network_plan(rank_form, name, rank, ranks)   # no TensorRT needed
    network = build_network(trt, builder, logger, cut_model, plan)       # trt/network.py
"""

from __future__ import annotations

from pathlib import Path

import onnx

from ...trt import profiles as profiles_mod
from ...trt.cut import CutModel, cut
from ...trt.plan import BuildPlan, CollectivePlan, TensorIO
from .ranks import DOMAIN

KINDS = {"AllReduce": "ALL_REDUCE", "AllGather": "ALL_GATHER"}


def collective_plans(model: onnx.ModelProto) -> list[CollectivePlan]:
    plans = []
    for node in model.graph.node:
        if node.domain != DOMAIN:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        plans.append(CollectivePlan(node=node.name, input=node.input[0], output=node.output[0],
                                    kind=KINDS[node.op_type], ranks=int(attrs["ranks"]), axis=int(attrs.get("axis", 0))))
    return plans


def _io(values) -> list[TensorIO]:
    return [TensorIO(v.name, onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
                     [d.dim_param or (d.dim_value if d.HasField("dim_value") else f"{v.name}_dim{i}")
                      for i, d in enumerate(v.type.tensor_type.shape.dim)]) for v in values]


def rank_network_plan(model: onnx.ModelProto, name: str, rank: int, ranks: int, *, max_positions: int = 2048,
                      max_batch: int = profiles_mod.DEFAULT_MAX_BATCH) -> tuple[BuildPlan, CutModel]:
    """The rank's build plan (its collectives, its I/O, one profile over its dynamic dims) and the model
    TensorRT's parser gets."""
    plans = collective_plans(model)
    if any(p.ranks != ranks for p in plans):
        raise ValueError(f"rank form of {name}: collectives over {sorted({p.ranks for p in plans})} ranks, not {ranks}")
    plan = BuildPlan(name=f"{name}.rank{rank}of{ranks}", form="tensor-parallel", precision="as the form",
                     collectives=plans, order=[p.node for p in plans], inputs=_io(model.graph.input),
                     outputs=_io(model.graph.output))
    plan.limits = profiles_mod.PlanLimits(max_batch, max_positions)
    plan.profiles = profiles_mod.default_profiles(plan.inputs, plan.limits)
    plan.notes.append(f"rank {rank} of {ranks}: NCCL collectives over ranks {list(range(ranks))}")
    return plan, cut(model, {p.node: p for p in plans})


def build_ranks(models: list[onnx.ModelProto], trt, out_dir: Path, name: str, *, max_positions: int,
                force: bool = False, source: str = "", plans: list | None = None) -> list[Path]:
    """One engine per rank form (GPU with TensorRT >= 11 only; not run on this project's CPU machines).
    `plans`: each rank's (BuildPlan, CutModel) when the forms are build's (rank_plan_from_prepared)."""
    from ...trt import engine as engine_mod
    from ...trt.config import create_config
    from ...trt.network import build_network

    written = []
    for r, model in enumerate(models):
        plan, cut_model = plans[r] if plans else rank_network_plan(model, name, r, len(models),
                                                                    max_positions=max_positions)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = build_network(trt, builder, logger, cut_model, plan)
        config = create_config(trt, builder, network, plan.profiles)
        blob = engine_mod.build_serialized(trt, builder, network, config)
        info = engine_mod.sidecar(plan, trt_version=getattr(trt, "__version__", None), source=source,
                                  gpu=engine_mod.gpu_name())
        info["tensor_parallel"] = {"rank": r, "ranks": len(models), "collectives": [c.__dict__ for c in plan.collectives]}
        written.append(engine_mod.write_engine(blob, info, out_dir, plan.name, force=force)[0])
    return written


def rank_plan_from_prepared(prepared, forms, rank: int) -> tuple[BuildPlan, CutModel]:
    """A rank's plan when the split is of build's verified form (ONNX Attention, RotaryEmbedding, KV-cache
    updates): the form's plan with each split site's heads divided, its operands as the rank form names
    them, and the rank's collectives; cut and profiled as build does. `forms` is split_model(form_model)."""
    import copy

    from ...trt.plan import io_contract

    model, split, ranks = forms.models[rank], forms.plan.split, forms.plan.ranks
    plan = copy.deepcopy(prepared.plan)
    plan.name = f"{plan.name}.rank{rank}of{ranks}"
    nodes = {n.name: n for n in model.graph.node}
    whole = {n.name: n for n in forms.original.graph.node}
    for a in plan.attentions:
        node, before = nodes.get(a.node), whole.get(a.node)
        if node is None or before is None:
            continue
        renamed = dict(zip(before.input, node.input))  # operands a rank reads through a Slice are renamed
        a.query, a.key, a.value = (renamed.get(t, t) for t in (a.query, a.key, a.value))
        a.mask = renamed.get(a.mask, a.mask) if a.mask else a.mask
        if before.input[0] in split.sharded and a.q_heads:
            a.q_heads //= ranks
            kv = split.sharded.get(before.input[1]) or split.activation_slices.get(
                next(((i, 1) for i, n in enumerate(forms.plan.nodes) if n.name == a.node), (-1, 1)))
            if a.kv_heads and kv is not None:  # split by KV heads, or one replicated KV head per rank
                a.kv_heads //= kv.blocks(ranks)
    plan.collectives = collective_plans(model)
    lowered = set(plan.order) | {c.node for c in plan.collectives}
    plan.order = [n.name for n in model.graph.node if n.name in lowered]
    plan.notes.append(f"rank {rank} of {ranks}: NCCL collectives over ranks {list(range(ranks))}")
    assert plan.limits is not None  # prepare planned them
    static = {c.cache: {2: plan.limits.max_cache} for c in plan.cache_updates} if plan.cache_updates else {}
    cut_model = cut(model, plan.lowered(), static)
    io_contract(model, cut_model.model, cut_model.inputs, plan, original=prepared.model)
    plan.profiles = profiles_mod.default_profiles(plan.inputs, plan.limits)
    return plan, cut_model
