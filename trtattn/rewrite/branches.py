"""Models whose If branches are chosen by a boolean input (Optimum's merged decoders: use_cache_branch).

One branch of such a model may return empty tensors by design (the with-cache branch of a merged
seq2seq decoder returns empty cross-attention presents: they were computed on the first step), so the
model as a whole has no feeds on which every output is filled, and verifying it as one model fails.
Instead each branch is taken as a model of its own (graph/branches.py: the condition input fixed, the
branch inlined; the with-cache branch then runs with a past of length > 0, the other with none), fused
and verified like any model, and the fused branches go back into the If. The fused model is the
original with each branch body replaced by its fused, verified counterpart.
"""

from __future__ import annotations

import dataclasses

import onnx

from ..errors import TrtattnError
from ..graph.branches import branch_inputs, empty_outputs, take_branch
from ..graph.io import default_session_refusal
from ..graph.shapes import upgrade_opset
from ..site import SiteStatus
from ..verify import Verification

BRIDGE = "/branch"  # suffix of the Identity take_branch adds from a branch output to the If's output


def by_branch(model: onnx.ModelProto, transform, **options):
    """`transform(model, **options)` (fuse_model or normalize_model) on each branch of the first boolean If
    condition. Returns (cond, {False: result, True: result}, the model with the changed branches put back
    into the If, or None when neither changed). Each result has .model, .changed, .verification."""
    cond = branch_inputs(model)[0]
    deciding = [n.name or n.output[0] for n in model.graph.node if n.op_type == "If" and n.input[0] == cond]
    if len(deciding) != 1:
        raise TrtattnError(f"'{cond}' decides {len(deciding)} If nodes ({', '.join(deciding)}); trtattn verifies a "
                           "model whose condition input decides one If (as Optimum's merged decoders)")
    results = {value: transform(take_branch(model, cond, value, drop_empty=True), **options) for value in (False, True)}
    if not any(r.changed for r in results.values()):
        return cond, results, None
    opset = max(_opset(r.model) for r in results.values() if r.changed)
    bodies = {v: (r.model if r.changed else upgrade_opset(take_branch(model, cond, v, drop_empty=True), opset))
              for v, r in results.items()}
    return cond, results, _merge(model, cond, bodies)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def in_branch(model: onnx.ModelProto, cond: str, value: bool, site):
    """A branch-taken model's site as a site of the merged model: named with its branch, its graph path
    through the If."""
    if_output = next(n.output[0] for n in model.graph.node if n.op_type == "If" and n.input[0] == cond)
    where = ((if_output, "then_branch" if value else "else_branch"),)
    return dataclasses.replace(site, name=f"{cond}={value}: {site.name}", graph=where + tuple(site.graph))


def tagged(cond: str, value: bool, skipped):
    return dataclasses.replace(skipped, name=f"{cond}={value}: {skipped.name}")


def fuse_branches(model: onnx.ModelProto, fuse, **options):
    """fuse_model of a model with If branches chosen by an input: the FuseResult of the whole model (sites
    of both branches, each named with its branch; the verification of both)."""
    cond, results, merged = by_branch(model, fuse, **options)
    reports, ignored = [], []
    for value, r in results.items():
        reports += [dataclasses.replace(rep, site=in_branch(model, cond, value, rep.site)) for rep in r.reports]
        ignored += [tagged(cond, value, i) for i in r.ignored]
    FuseResult = type(results[True])  # (fuse's own result type: this module does not import fuse)
    refusal = default_session_refusal(merged) if merged is not None else None
    if refusal is not None:  # each branch loads; the merged model must too, as the user will load it
        for rep in reports:
            if rep.status == SiteStatus.FUSED:
                rep.status = SiteStatus.NOT_FUSED
                rep.reason = f"ONNX Runtime with default session options refuses the merged model: {refusal}"
        merged = None
    return FuseResult(merged or model, reports, ignored, verification(cond, results), merged is not None)


def verification(cond: str, results: dict) -> Verification:
    parts = {f"{cond}={v}": r.verification for v, r in results.items()}
    passed = [p.passed for p in parts.values()]
    errors = [p.max_abs_err for p in parts.values() if p.max_abs_err is not None]
    its = [p.iterations for p in parts.values() if p.iterations]
    return Verification(passed=False if False in passed else (None if None in passed else True), branches=parts,
                        note_branches=f"each branch verified on its own ({cond} forced False, with no past; True, "
                                      "with a past)",
                        max_abs_err=max(errors) if errors else None, iterations=sum(its) if its else None)


def _merge(model: onnx.ModelProto, cond: str, bodies: dict) -> onnx.ModelProto:
    """The original `model` (its opset raised to the fused branches') with each If decided by `cond`
    taking its branch body from the fused, branch-taken model of that value."""
    base = bodies[True]
    main_inits = {i.name for i in model.graph.initializer}
    outer_outputs = {o for n in model.graph.node if not (n.op_type == "If" and n.input[0] == cond) for o in n.output}
    out = onnx.ModelProto()
    out.CopyFrom(base)
    if_node = next(n for n in model.graph.node if n.op_type == "If" and n.input[0] == cond)
    original = {v: next(a.g for a in if_node.attribute if a.name == ("then_branch" if v else "else_branch"))
                for v in bodies}
    branch_graphs = {v: _body(fused, if_node, original[v], outer_outputs, main_inits) for v, fused in bodies.items()}
    nodes = []
    bridges = {f"{o}{BRIDGE}" for o in if_node.output if o}
    for n in base.graph.node:
        if n.name in bridges:
            continue
        if all(o in outer_outputs for o in n.output if o):
            nodes.append(n)
    new = onnx.NodeProto()
    new.CopyFrom(if_node)
    del new.attribute[:]
    new.attribute.extend([onnx.helper.make_attribute("then_branch", branch_graphs[True]),
                          onnx.helper.make_attribute("else_branch", branch_graphs[False])])
    nodes.append(new)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    # the main graph's weights: a branch may have dropped one only the other reads
    kept_inits: dict[str, onnx.TensorProto] = {}
    for fused in bodies.values():
        kept_inits.update({t.name: t for t in fused.graph.initializer if t.name in main_inits and t.name not in kept_inits})
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_inits.values())
    # the original's inputs (a taken branch keeps only those it reads), as the fused branches type them
    fused_inputs = {i.name: i for v in (False, True) for i in bodies[v].graph.input}
    order = [i.name for i in model.graph.input]
    inputs = [fused_inputs.get(i.name, i) for i in model.graph.input]
    inputs += [i for i in base.graph.input if i.name not in order]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    del out.graph.output[:]  # the taken branch left its placeholders out: the If returns them all again
    out.graph.output.extend(model.graph.output)
    del out.graph.value_info[:]
    return out


def _body(fused: onnx.ModelProto, if_node, branch: onnx.GraphProto, outer_outputs: set,
          main_inits: set) -> onnx.GraphProto:
    """The If's branch body out of the branch-taken fused model: every node that is neither an outer node
    nor a bridge, the initializers the original main graph did not have, and as outputs what the bridges
    read (typed as the If's outputs); the branch's placeholder outputs (empty constants, left out of the
    taken model) as the original branch made them."""
    bridge = {n.output[0]: n for n in fused.graph.node if n.op_type == "Identity" and n.name.endswith(BRIDGE)}
    inner = [n for n in fused.graph.node if n.output[0] not in bridge and not all(o in outer_outputs for o in n.output if o)]
    inits = [t for t in fused.graph.initializer if t.name not in main_inits]
    types = {vi.name: vi for vi in list(fused.graph.value_info) + list(fused.graph.output)}
    for placeholder in empty_outputs(branch):
        inner += [n for n in branch.node if placeholder in n.output]
        inits += [t for t in branch.initializer if t.name == placeholder]
    outputs = []
    for o, made in zip(if_node.output, branch.output):
        if made.name in empty_outputs(branch):
            outputs.append(made)
            continue
        vi = onnx.ValueInfoProto()
        if o in types:
            vi.CopyFrom(types[o])
        vi.name = bridge[o].input[0] if o in bridge else o
        outputs.append(vi)
    return onnx.helper.make_graph(inner, f"{if_node.name or 'if'}_branch", [], outputs, initializer=inits)
