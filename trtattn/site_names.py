"""The names trtattn gives what it writes for a site, and their reading back: one module writes and parses both.

- ONNX: every node and tensor a rewrite writes for a site is named under ``trtattn/<site>/`` (site_scope), so an
  ONNX Runtime error that names one is blamed on its site (names_site).
- TensorRT: each IAttention is the layer ``trtattn/attn/<site>``, its support layers under it
  (``trtattn/attn/<site>/q_scale``) (engine_layer), with the metadata ``trtattn site=<site> onnx=<node>``
  (layer_metadata); `trtattn inspect` finds the sites in the engine's layer info by both (engine_layer_sites,
  metadata_sites).
"""

from __future__ import annotations

import re

PREFIX = "trtattn"
ENGINE_SCOPE = f"{PREFIX}/attn"

# a name ends at whitespace, brackets, separators and the record separators TensorRT's layer info puts in names
_ENGINE_LAYER_RE = re.compile(rf"{re.escape(ENGINE_SCOPE)}/([^\s\[\]{{}}()+,;|\x1e\x1f]+)")
_METADATA_RE = re.compile(rf"{PREFIX} site=([^\s\[\]\x1e\x1f]+)")


def site_scope(site: str, *parts: str) -> str:
    """`trtattn/<site>/<part>/...`: the scope of what a rewrite writes for `site`."""
    return "/".join((PREFIX, site, *parts))


def names_site(text: str, site: str) -> bool:
    """Whether `text` (an ONNX Runtime error, say) names a node or tensor written for `site`."""
    return f"{site_scope(site)}/" in text


def engine_layer(site: str) -> str:
    """`trtattn/attn/<site>`: the name of the site's IAttention in the engine."""
    return f"{ENGINE_SCOPE}/{site}"


def layer_metadata(site: str, node: str) -> str:
    """The metadata of the site's IAttention: which site and which ONNX node it lowers."""
    return f"{PREFIX} site={site} onnx={node}"


def engine_layer_sites(text: str) -> list[str]:
    """The site names (with whatever support-layer path follows) of every `trtattn/attn/...` in `text`."""
    return _ENGINE_LAYER_RE.findall(text)


def metadata_sites(text: str) -> list[str]:
    """The site names of every `trtattn site=<site>` metadata in `text`."""
    return _METADATA_RE.findall(text)
