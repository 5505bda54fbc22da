"""Prove from an engine's layer info that every attention runs as a fused kernel.

    report = inspect("engines/llama.engine", sites="engines/llama.json")   # or a trtexec layer-info JSON / log
    print(render_table(report))

parse.py reads the layer info (engines through trtattn.trt.inspector, loaded only for them) into layers.py's
model; sites.py finds each attention and its layers; classify.py gives the verdict per site (fused, unproven, not
fused, missing) and the report; precision.py reads the precision each site ran in; report.py renders it.
"""

from __future__ import annotations

from pathlib import Path

from .classify import classify
from .layers import Layer, LayerInfo, make_layer
from .parse import load_layer_info, load_sites, parse_layer_info_json, parse_layer_info_log, read_engine
from .report import render_table


def inspect(path: str | Path, sites: str | Path | list[dict] | None = None) -> dict:
    """The report for an engine or its layer info; `sites`: the sidecar (its path, or its list of sites)."""
    if isinstance(sites, (str, Path)):
        sites = load_sites(sites)
    return classify(load_layer_info(path), sites)


__all__ = ["inspect", "classify", "render_table", "load_layer_info", "load_sites", "read_engine",
           "parse_layer_info_json", "parse_layer_info_log", "Layer", "LayerInfo", "make_layer"]
