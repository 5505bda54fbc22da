"""routes/prepare/kv_cache.py: caches the graph concatenates that the kv-cache form cannot own are refused, each site
with why (issue 32: openai-whisper's stacked caches and its position offset read from the cache's length), not read
as sites without a cache; the padded plan says why it has no KV-cache update."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
import pytest

from trtattn.errors import SitesRefused
from trtattn.rewrite.fuse import fuse_model
from trtattn.routes.prepare.forms import derive
from trtattn.routes.prepare.kv_cache import kv_cache_form, unowned_caches
from trtattn.site import CacheKind, SiteStatus
from trtattn.testing.exports import export_module

torch = pytest.importorskip("torch")

D, H = 16, 2


def _cached(stacked: bool, offset: bool, heads_cache: bool = False) -> onnx.ModelProto:
    """One self-attention appending its new K/V to a cache input (torch.cat on the key axis), as whisper does:
    `stacked`: the cache is the first of a stack [1, B, S, D] (kc[0], a Gather); `offset`: the new tokens' positions
    start at the cache's length (a Shape read of it); `heads_cache`: the cache is [B, H, S, D/H] and takes the new
    K/V in that layout, as a past_key_values input does."""
    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))
            self.pos = torch.nn.Parameter(torch.randn(32, D))

        def forward(self, x, kc, vc):
            def heads(t):
                return t.view(t.shape[0], t.shape[1], H, D // H).permute(0, 2, 1, 3)

            past = kc.shape[-2]  # the cache's key axis in each layout
            if offset:
                x = x + self.pos[past:past + x.shape[1]]
            k0, v0 = (kc[0], vc[0]) if stacked else (kc, vc)
            if heads_cache:
                k, v = torch.cat([k0, heads(self.k(x))], 2), torch.cat([v0, heads(self.v(x))], 2)
            else:
                k, v = heads(torch.cat([k0, self.k(x)], 1)), heads(torch.cat([v0, self.v(x)], 1))
            w = (heads(self.q(x)) @ k.transpose(-1, -2) * (D // H) ** -0.5).softmax(-1)
            return self.o((w @ v).permute(0, 2, 1, 3).reshape(x.shape)), k, v

    cache = torch.zeros((1, H, 2, D // H) if heads_cache else ((1, 1, 2, D) if stacked else (1, 2, D)))
    axis = cache.dim() - 2
    return export_module(Cached(), (torch.randn(1, 3, D), cache, cache.clone()), ["x", "kc", "vc"],
                         {"x": {1: "n"}, "kc": {axis: "t"}, "vc": {axis: "t"}}, output_names=["y", "k", "v"])


def _unowned(model: onnx.ModelProto) -> tuple[dict[str, str], object]:
    fused = fuse_model(model)
    assert [r.status for r in fused.reports] == [SiteStatus.FUSED], [r.reason for r in fused.reports]
    return unowned_caches(gs.import_onnx(fused.model), fused.reports), fused


def test_a_stacked_cache_is_named_as_taken_apart_before_its_concat():
    unowned, fused = _unowned(_cached(stacked=True, offset=False))
    [why] = unowned.values()
    assert "kc is taken apart before its Concat (Gather" in why and "one cache input per layer" in why, why
    assert "reads the length" not in why
    with pytest.raises(SitesRefused, match="cannot own the caches") as e:
        kv_cache_form(fused.model, fused.reports)
    assert e.value.sites == list(unowned.items())


def test_a_cache_whose_length_the_graph_reads_is_named_with_the_node():
    unowned, _ = _unowned(_cached(stacked=False, offset=True))
    [why] = unowned.values()
    assert "reads the length of kc" in why and "taken apart" not in why, why


def test_a_stacked_cache_read_for_an_offset_is_named_for_both():
    """openai-whisper's decoder: both reasons, the stack followed through its Gather to the Shape of the layer's
    cache (the axis it reads is the cache's key axis, one lower after the stack's axis is gathered)."""
    unowned, _ = _unowned(_cached(stacked=True, offset=True))
    [why] = unowned.values()
    assert "taken apart" in why and "reads the length of kc" in why, why


def test_a_cache_concatenated_before_the_head_split_is_named_as_not_appended_as_the_k_v():
    unowned, _ = _unowned(_cached(stacked=False, offset=False))
    [why] = unowned.values()
    assert "not as the K/V of the attention" in why, why


def test_a_past_key_values_cache_is_not_named():
    """The cache the form owns (K/V appended to a [B, N, S, H] input): the site is a concat cache, not named."""
    unowned, fused = _unowned(_cached(stacked=False, offset=False, heads_cache=True))
    assert [r.site.cache for r in fused.reports] == [CacheKind.CONCAT] and unowned == {}


def test_the_padded_form_says_why_no_kv_cache_update_is_planned():
    model = _cached(stacked=True, offset=True)
    fused = fuse_model(model)
    notes = derive(None, model, fused).notes
    assert any(n.startswith("no KV-cache update planned for ") and "taken apart" in n for n in notes), notes
