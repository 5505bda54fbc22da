"""Finding the attentions in layer info, and which engine layers belong to each (whether they fused is
classify.py's question).

- Pattern attentions, from the ONNX node names the parser records (Metadata ``[ONNX Layer:
  /model/layers.0/self_attn/Softmax]``, or the layer names themselves): a Softmax between two MatMuls of the
  same module (or, for exports without module scopes, fed by a MatMul and feeding one) is an attention; any
  other Softmax (a classifier head) is listed apart and never counted.
- Sites swapped for IAttention by ``trtattn build``, by their names (layer name or metadata
  ``trtattn/attn/<site>``, metadata ``trtattn site=<site>``) and through the sidecar's list of sites.
- Fused attention layers that neither claimed, named after their module.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..site_names import engine_layer, engine_layer_sites, metadata_sites
from .layers import LayerInfo, is_matmul_op, is_softmax_op, norm, scope_of, strip_myelin_suffix

WINDOW = 4  # layers searched on each side of a softmax when the layer info has no tensor names
HOPS = 4  # layers followed through tensors from a softmax to the MatMuls around it


@dataclass
class Site:
    """One attention found in the layer info: its name and the indices of its engine layers."""
    name: str
    key: str
    order: float
    core: set[int] = field(default_factory=set)
    softmax: str | None = None  # the ONNX Softmax it was found by, if any
    record: dict | None = None  # its entry in the sidecar, if listed there


@dataclass
class Found:
    sites: list[Site]  # in engine order
    other_softmax: list[dict]  # {name, layers, reason}: softmaxes that are not attention


def find_sites(info: LayerInfo, sidecar_sites: list[dict] | None = None) -> Found:
    finder = _Finder(info)
    finder.find_pattern_attentions()
    finder.map_named_sites(sidecar_sites or [])
    finder.claim_stray_kernels()
    return Found(sorted(finder.sites.values(), key=lambda s: (s.order, s.name)), finder.other)


def _trtattn_sites(text: str) -> list[str]:
    text = text.replace("...", " ")  # {ForeignNode[trtattn/attn/a/q_heads...trtattn/attn/a]}
    return [strip_myelin_suffix(found) for found in engine_layer_sites(text)]


def _mentions(text: str, keys) -> set[str]:
    """Keys (normalised site or layer names) that `text` names as a whole: not a prefix of a longer path."""
    text = norm(text) if text else ""
    hits = []
    for key in keys:
        start = 0
        while key and (i := text.find(key, start)) >= 0:
            j = i + len(key)
            before = text[i - 1] if i else ""
            after = text[j] if j < len(text) else ""
            if not (before.isalnum() or before == "_") and not (after.isalnum() or after in "_/#"):
                hits.append((i, j, key))
            start = i + 1
    return {k for i, j, k in hits if not any(a <= i and j <= b and b - a > j - i for a, b, _ in hits)}


class _Finder:
    def __init__(self, info: LayerInfo):
        self.info = info
        self.layers = info.layers
        self.sites: dict[str, Site] = {}
        self.other: list[dict] = []
        self.producers: dict[str, list[int]] = defaultdict(list)
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for layer in self.layers:
            for t in layer.outputs:
                self.producers[t].append(layer.index)
            for t in layer.inputs:
                self.consumers[t].append(layer.index)

    def site(self, name: str, order: float) -> Site:
        key = norm(name)
        if key not in self.sites:
            self.sites[key] = Site(name=name, key=key, order=order)
        site = self.sites[key]
        site.order = min(site.order, order)
        if "." in name and "." not in site.name:
            site.name = name  # prefer the ONNX spelling (layers.0) over Myelin's (layers_0)
        return site

    # -- pattern attentions: MatMul -> Softmax -> MatMul in the ONNX node names
    def find_pattern_attentions(self) -> None:
        softmaxes: dict[str, list[int]] = {}
        matmuls: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for layer in self.layers:
            for n in layer.onnx:
                if is_softmax_op(n):
                    softmaxes.setdefault(n, []).append(layer.index)
                elif is_matmul_op(n):
                    matmuls[norm(scope_of(n))].append((layer.index, n))
            if not layer.onnx and layer.softmax_type:
                softmaxes.setdefault(layer.name, []).append(layer.index)
        used: dict[str, int] = defaultdict(int)
        for name, idxs in sorted(softmaxes.items(), key=lambda kv: min(kv[1])):
            first = min(idxs)
            scope = scope_of(name)
            core, reason = self._core(name, scope, idxs, matmuls)
            if core is None:
                self.other.append({"name": name, "layers": [self.layers[i].name for i in sorted(set(idxs))],
                                   "reason": reason})
                continue
            base = scope if scope else name
            seen = used[norm(base)]
            used[norm(base)] += 1
            site = self.site(base if seen == 0 else f"{base}#{seen}", first)
            site.core |= core
            site.softmax = name
        # ForeignNode[A...B] over the MatMul..MatMul_1 of one module: that module's attention, softmax inside.
        for layer in self.layers:
            for a, b in layer.ranges:
                if scope_of(a) and scope_of(a) == scope_of(b) and is_matmul_op(a) and is_matmul_op(b) and a != b:
                    if not any(s.key == norm(scope_of(a)) and layer.index in s.core for s in self.sites.values()):
                        self.site(scope_of(a), layer.index).core.add(layer.index)

    def _core(self, name: str, scope: str, idxs: list[int], matmuls) -> tuple[set[int] | None, str]:
        first, last = min(idxs), max(idxs)
        core = set(idxs)
        if any(self.layers[i].evidence for i in idxs):
            return core, ""  # the softmax sits in a fused attention kernel
        if scope:
            for scopes in ([norm(scope)], [norm(scope), norm(scope_of("/" + scope))]):
                cands = [m for s in dict.fromkeys(scopes) for m in matmuls.get(s, [])]
                before = sorted((m for m in cands if m[0] <= first), key=lambda m: -m[0])
                after = sorted((m for m in cands if m[0] >= last), key=lambda m: m[0])
                for b in before:
                    a = next((m for m in after if m[1] != b[1]), None)
                    if a is not None:
                        return core | {b[0], a[0]}, ""
            # The module path is the ONNX-level identity of an attention: no pair of MatMuls, no attention.
            return None, f"not between two MatMuls of its module '{scope}'"
        same = {n for i in idxs for n in self.layers[i].onnx if is_matmul_op(n)}
        if len(same) >= 2:
            return core, ""
        # Node names without module scopes (dynamo exports: node_softmax): follow the tensors.
        if self.info.has_tensors:
            up = self._reach(idxs, up=True)
            down = self._reach(idxs, up=False)
            if up is not None and down is not None:
                return core | {up, down}, ""
            missing = " and ".join(x for x, hit in (("fed by", up), ("feeding", down)) if hit is None)
            return None, f"not {missing} a MatMul"
        # Names only, no tensors: the nearest layers on each side, in engine order.
        up = next((j for j in range(first - 1, max(-1, first - 1 - WINDOW), -1) if self._stop_or_mm(j)), None)
        down = next((j for j in range(last + 1, min(len(self.layers), last + 1 + WINDOW)) if self._stop_or_mm(j)),
                    None)
        up = up if up is not None and self.layers[up].matmul_like else None
        down = down if down is not None and self.layers[down].matmul_like else None
        if up is not None and down is not None:
            return core | {up, down}, ""
        return None, f"no MatMul within {WINDOW} layers {'before' if up is None else 'after'} it"

    def _stop_or_mm(self, j: int) -> bool:
        return self.layers[j].matmul_like or self.layers[j].runs_softmax

    def _reach(self, start: list[int], up: bool) -> int | None:
        seen = set(start)
        frontier = set(start)
        for _ in range(HOPS):
            nxt = set()
            for i in frontier:
                layer = self.layers[i]
                for t in (layer.inputs if up else layer.outputs):
                    for j in (self.producers if up else self.consumers).get(t, []):
                        if j in seen:
                            continue
                        seen.add(j)
                        if self.layers[j].matmul_like:
                            return j
                        if self.layers[j].runs_softmax:
                            continue  # another softmax: not this one's MatMul
                        nxt.add(j)
            frontier = nxt
        return None

    # -- sites named by the builder (IAttention) and by the sidecar
    def map_named_sites(self, sidecar_sites: list[dict]) -> None:
        """trtattn build names each IAttention `trtattn/attn/<site>` (its support layers `.../<site>/q_scale`,
        ...) and sets its metadata to `trtattn site=<site> onnx=<node>`; the sidecar lists the sites."""
        keys: dict[str, str] = {}  # normalised mention -> site name
        for s in sidecar_sites:
            name = s["name"]
            site = self.site(name, float("inf"))
            site.record = s
            site.name = name
            for mention in (name, engine_layer(name), s.get("layer"), s.get("layer_name")):
                if isinstance(mention, str) and mention:
                    keys[norm(mention)] = name
        known = {norm(s["name"]): s["name"] for s in sidecar_sites}
        for layer in self.layers:
            for found in metadata_sites(layer.note):
                known.setdefault(norm(found), found)
        named = {norm(f): f for layer in self.layers for f in _trtattn_sites(f"{layer.name} {layer.note}")}

        def resolve(found: str) -> str:
            """`model/layers.0/self_attn/q_scale` -> the site it belongs to (longest known prefix)."""
            key = norm(found)
            # a known site: the longest that is a prefix; else the shortest name itself seen as trtattn/attn/...
            for pool, pick in ((known, max), (named, min)):
                prefixes = [k for k in pool if key == k or key.startswith(k + "/")]
                if prefixes:
                    return pool[pick(prefixes, key=len)]
            return found

        for layer in self.layers:
            text = f"{strip_myelin_suffix(layer.name)} {layer.note}"
            hits = {keys[k] for k in _mentions(text, keys)}
            hits |= {known[norm(f)] for f in metadata_sites(layer.note)}
            hits |= {resolve(f) for f in _trtattn_sites(text)}
            for name in hits:
                self.site(name, layer.index).core.add(layer.index)

    # -- fused attention layers that no site claimed
    def claim_stray_kernels(self) -> None:
        claimed = {i for s in self.sites.values() for i in s.core}
        for layer in self.layers:
            if layer.evidence is None or layer.index in claimed:
                continue
            scopes = {scope_of(n) for n in layer.onnx if scope_of(n)}
            if len(scopes) == 1:
                name = scopes.pop()
            elif layer.note and " " not in layer.note:
                name = layer.note
            else:
                name = layer.name
            self.site(name, layer.index).core.add(layer.index)
