"""Each rank's network for TensorRT: the rank form cut at its `trtattn.dist` nodes (trt/cut.py), parsed by
the ONNX parser, each collective lowered to an IDistCollectiveLayer (trt/lower.py, CollectivePlan).

    plan, cut_model = rank_network_plan(rank_form, name, rank, ranks)   # no TensorRT needed
    network = build_network(trt, builder, logger, cut_model, plan)       # trt/network.py
"""

from __future__ import annotations

import onnx

from ...trt.cut import CutModel, cut
from ...trt.plan import BuildPlan, CollectivePlan
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


def rank_network_plan(model: onnx.ModelProto, name: str, rank: int, ranks: int) -> tuple[BuildPlan, CutModel]:
    plans = collective_plans(model)
    if any(p.ranks != ranks for p in plans):
        raise ValueError(f"rank form of {name}: collectives over {sorted({p.ranks for p in plans})} ranks, not {ranks}")
    plan = BuildPlan(name=f"{name}.rank{rank}of{ranks}", form="tensor-parallel", precision="as the form",
                     collectives=plans, order=[p.node for p in plans],
                     outputs=[{"name": o.name} for o in model.graph.output])
    return plan, cut(model, {p.node: p for p in plans})
