"""match/cache.py's cache_lengths: a graph input concatenated onto a site's keys along their key axis, found from
the site's axes (through a stack's Gather, a keep-last-n Slice, the head split), whatever the input's name."""

import pytest

from trtattn.graph.view import GraphView, import_graph
from trtattn.match.find import match
from trtattn.site import CacheLength
from trtattn.testing.exports import export_module

torch = pytest.importorskip("torch")

D, H = 16, 2


class _Appending(torch.nn.Module):
    """BNSH keys and values appended to cache inputs [B, H, t, D/H] along `axis` (2: the key axis)."""

    def __init__(self, axis: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.axis = axis
        self.q, self.k, self.v = (torch.nn.Linear(D, D) for _ in range(3))

    def forward(self, x, a, b):
        def heads(t):
            return t.view(t.shape[0], t.shape[1], H, D // H).transpose(1, 2)

        k = torch.cat([a, heads(self.k(x))], self.axis)
        v = torch.cat([b, heads(self.v(x))], self.axis)
        q = heads(self.q(x))
        if self.axis != 2:  # features appended: the product reads as many as the query has
            k, v = k[..., : D // H], v[..., : D // H]
        return (q @ k.transpose(-1, -2)).softmax(-1) @ v


def _lengths(module, cache_shape) -> list[tuple]:
    x, cache = torch.randn(1, 3, D), torch.zeros(cache_shape)
    axes = {"x": {1: "n"}, "a": {2: "t"}, "b": {2: "t"}} if cache_shape[2] != 3 else {"x": {1: "n"}}
    model = export_module(module, (x, cache, cache), ["x", "a", "b"], axes)
    graph = import_graph(model)
    return [s.cache_lengths for s in match(graph, GraphView(graph, model)).sites]


def test_a_cache_concatenated_on_the_key_axis_is_a_past_whatever_its_name():
    assert _lengths(_Appending(), (1, H, 2, D // H)) == [(CacheLength("a", "t", "n"),)]


def test_a_concat_along_another_axis_is_not():
    assert _lengths(_Appending(axis=3), (1, H, 3, D // H)) == [()]


def test_the_seed_cache_stacked_and_windowed():
    from tests.rewrite.test_fuse_seed_cache import _seed_model

    model = _seed_model()
    graph = import_graph(model)
    [site] = match(graph, GraphView(graph, model)).sites
    assert site.cache_lengths == (CacheLength("kc", "t", "n"),)
