"""The verdict per attention site, and the report: what counts as proof of fusion and what fails
``--require-fused`` is decided here and nowhere else.

A site is *fused* when a layer of it carries fused-attention evidence (a kernel or tactic named ``mha`` /
``fmha`` / ``_gemm_mha_v2`` / flash attention, or a layer typed as an attention: layers.Layer.evidence); *not
fused* when it runs as separate layers (gemm + softmax + gemm); *missing* when the sidecar lists it and the
layer info does not show it.
"""

from __future__ import annotations

from .layers import Layer, LayerInfo
from .sites import Site, find_sites


def classify(info: LayerInfo, sites: list[dict] | None = None) -> dict:
    """The report: one row per attention (fused or not, its layers and kernel), the other softmaxes, a summary.
    `sites`: the sidecar's site records (parse.load_sites), each of which must be found."""
    found = find_sites(info, sites)
    names_only = info.verbosity == "layer_names_only"
    attention, failures = [], []
    for site in found.sites:
        layers = [info.layers[i] for i in sorted(site.core)]
        row, failure = _verdict(site, layers, names_only)
        attention.append(row)
        if failure:
            failures.append(failure)
    claimed = {i for s in found.sites for i in s.core}
    opaque = [layer.name for layer in info.layers if layer.opaque and layer.index not in claimed]
    if opaque and not attention:
        failures.append(f"{len(opaque)} Myelin/ForeignNode layer(s) without kernel detail may hide attention; "
                        "rebuild with --profilingVerbosity=detailed")
    fused = sum(r["fused"] for r in attention)
    missing = [r["site"] for r in attention if r["status"] == "missing"]
    summary = {"attention": len(attention), "fused": fused,
               "not_fused": len(attention) - fused - len(missing), "missing": missing,
               "other_softmax": len(found.other_softmax), "opaque_layers": opaque, "layers": len(info.layers),
               "verbosity": info.verbosity, "failures": failures, "ok": not failures}
    return {"source": info.source, "format": info.format, "tensorrt": info.tensorrt,
            "attention": attention, "other_softmax": found.other_softmax, "summary": summary}


def _verdict(site: Site, layers: list[Layer], names_only: bool) -> tuple[dict, str | None]:
    """The site's row (status fused / not fused / missing, with the reason) and its failure, if any."""
    evidence = [layer.evidence for layer in layers if layer.evidence]
    row = {"site": site.name, "fused": bool(evidence), "layers": [layer.name for layer in layers],
           "kernel": evidence[0] if evidence else None}
    failure = None
    if evidence:
        row["status"] = "fused"
    elif not layers:
        row["status"] = "missing"
        row["reason"] = "listed in the sidecar but not found in the layer info"
        failure = f"{site.name}: {row['reason']}"
    else:
        row["status"] = "not fused"
        if names_only:
            row["reason"] = "layer info has layer names only, no kernels (rebuild with --profilingVerbosity=detailed)"
        else:
            types = ", ".join(dict.fromkeys(layer.type for layer in layers if layer.type)) or "layers"
            row["reason"] = f"no fused attention kernel: runs as {len(layers)} layer(s) ({types})"
        failure = f"{site.name}: not fused ({row['reason']})"
    row["listed_in_sidecar"] = site.record is not None
    if site.softmax:
        row["softmax"] = site.softmax
    return row, failure
