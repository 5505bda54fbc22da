"""The verdict per attention site, and the report: what counts as proof of fusion and what fails
``--require-fused`` is decided here and nowhere else.

A site is *fused* when it is proven so: a layer of it names a fused-attention kernel in its kernel or tactic name
(``mha`` / ``fmha`` / ``_gemm_mha_v2`` / flash attention: layers.Layer.kernel), or a layer typed as an attention
belongs to a site the sidecar records as built with ``decomposable`` False (TensorRT then fails the build rather
than split it). A layer typed as an attention without either is *unproven*: a decomposable IAttention may have
fallen back to separate layers. A site is *not fused* when it runs as separate layers (gemm + softmax + gemm);
*missing* when the sidecar lists it and the layer info does not show it.

``--require-fused`` fails on every site that is not proven fused, on a quantized site that did not run in its
quantized type (precision.py: a user who asked for FP8 and got FP16 did not get the fused attention they built),
and on layer info where no attention is found at all (nothing is proven then).
"""

from __future__ import annotations

from .layers import Layer, LayerInfo
from .precision import built_for, precision_problem, ran_in
from .sites import Site, find_sites


def classify(info: LayerInfo, sites: list[dict] | None = None) -> dict:
    """The report: one row per attention (fused or not, its layers and kernel), the other softmaxes, a summary.
    `sites`: the sidecar's site records (parse.load_sites), each of which must be found."""
    found = find_sites(info, sites)
    names_only = info.verbosity == "layer_names_only"
    attention, failures = [], []
    for site in found.sites:
        layers = [info.layers[i] for i in sorted(site.core)]
        row, site_failures = _verdict(site, layers, names_only)
        attention.append(row)
        failures += site_failures
    claimed = {i for s in found.sites for i in s.core}
    opaque = [layer.name for layer in info.layers if layer.opaque and layer.index not in claimed]
    if not attention:
        failures.append(
            f"{len(opaque)} Myelin/ForeignNode layer(s) without kernel detail may hide attention; "
            "rebuild with --profilingVerbosity=detailed" if opaque else
            f"no attention found in {len(info.layers)} layer(s), so none is proven fused")
    fused = sum(r["fused"] for r in attention)
    missing = [r["site"] for r in attention if r["status"] == "missing"]
    unproven = sum(r["status"] == "unproven" for r in attention)
    summary = {"attention": len(attention), "fused": fused,
               "not_fused": len(attention) - fused - len(missing) - unproven, "unproven": unproven,
               "missing": missing, "wrong_precision": [r["site"] for r in attention if r.get("precision_problem")],
               "other_softmax": len(found.other_softmax), "opaque_layers": opaque, "layers": len(info.layers),
               "verbosity": info.verbosity, "failures": failures, "ok": not failures}
    return {"source": info.source, "format": info.format, "tensorrt": info.tensorrt,
            "attention": attention, "other_softmax": found.other_softmax, "summary": summary}


def _verdict(site: Site, layers: list[Layer], names_only: bool) -> tuple[dict, list[str]]:
    """The site's row (status fused / unproven / not fused / missing, with the reason; the precision it ran in)
    and its failures."""
    kernels = [layer.kernel for layer in layers if layer.kernel]
    typed = [layer for layer in layers if layer.attention_type]
    record = site.record or {}
    row = {"site": site.name, "fused": False, "layers": [layer.name for layer in layers],
           "kernel": kernels[0] if kernels else None, "proof": None}
    failures = []
    if kernels:
        row.update(status="fused", fused=True, proof="kernel")
    elif typed and record.get("decomposable") is False:
        row.update(status="fused", fused=True, proof="sidecar: built with decomposable=False")
    elif typed:
        row["status"] = "unproven"
        row["reason"] = (f"{typed[0].type} layer {typed[0].name} names no kernel or tactic, and "
                         + ("the sidecar records decomposable=True" if record.get("decomposable") else
                            "no sidecar records decomposable=False for it")
                         + ": TensorRT may have split it (rebuild with --profilingVerbosity=detailed, or pass the "
                           "sidecar with --sites)")
        failures.append(f"{site.name}: unproven ({row['reason']})")
    elif not layers:
        row["status"] = "missing"
        row["reason"] = "listed in the sidecar but not found in the layer info"
        failures.append(f"{site.name}: {row['reason']}")
    else:
        row["status"] = "not fused"
        if names_only:
            row["reason"] = "layer info has layer names only, no kernels (rebuild with --profilingVerbosity=detailed)"
        else:
            types = ", ".join(dict.fromkeys(layer.type for layer in layers if layer.type)) or "layers"
            row["reason"] = f"no fused attention kernel: runs as {len(layers)} layer(s) ({types})"
        failures.append(f"{site.name}: not fused ({row['reason']})")
    ran, built = (ran_in(layers) if layers else None), built_for(site.record)
    row["precision"], row["built_for"] = ran, built
    problem = precision_problem(ran, built) if layers else None
    if problem:
        row["precision_problem"] = problem
        failures.append(f"{site.name}: {problem}")
    row["listed_in_sidecar"] = site.record is not None
    if site.softmax:
        row["softmax"] = site.softmax
    return row, failures
