"""match/probe.py: a mask is read as it meets the logits (broadcast over them), and a causal reading agrees with
every probe's, square or not."""

import numpy as np
import pytest

from trtattn.graph.dim_names import resolve_dims
from trtattn.graph.feeds import make_feeds
from trtattn.graph.view import GraphView, import_graph
from trtattn.match.find import match
from trtattn.match.probe import _agree, _meaning, probe_masks
from trtattn.site import CausalKind


def _causal(q: int, k: int) -> np.ndarray:
    """An additive bottom-right causal mask [q, k]: query i sees keys up to i + k - q."""
    i, j = np.arange(q)[:, None], np.arange(k)[None, :]
    return np.where(j <= i + k - q, 0.0, -np.inf).astype(np.float32)


def test_a_square_causal_probe_and_a_decode_step_agree_on_lower_right():
    square, step = _meaning(_causal(4, 4), False), _meaning(_causal(1, 6), False)
    assert (square.causal, step.pattern) == (CausalKind.UPPER_LEFT, "none")  # alone, each reads its own way
    [agreed] = _agree([{"s": square}, {"s": step}]).values()
    assert (agreed.pattern, agreed.causal) == ("causal", CausalKind.LOWER_RIGHT)


def test_an_upper_left_mask_stays_upper_left_where_a_probe_tells_them_apart():
    i, j = np.arange(4)[:, None], np.arange(6)[None, :]
    upper = np.where(j <= i, 0.0, -np.inf).astype(np.float32)  # more keys than queries, aligned top-left
    [agreed] = _agree([{"s": _meaning(_causal(4, 4), False)}, {"s": _meaning(upper, False)}]).values()
    assert (agreed.pattern, agreed.causal) == ("causal", CausalKind.UPPER_LEFT)


def test_a_mask_is_read_over_every_key_it_broadcasts_over():
    """The seed's mask[:n, :n] at one new token over a cache is (1, 1): read as the logits see it, it masks none of
    the keys (not 'key 0 only', which its own shape would say)."""
    pytest.importorskip("torch")
    from tests.rewrite.test_fuse_seed_cache import CTX, _seed_model

    model = _seed_model()
    graph = import_graph(model)
    sites = match(graph, GraphView(graph, model)).sites
    dims = resolve_dims(model, {"n": 1, "t": 3})
    [read] = probe_masks(graph, model, sites, [make_feeds(model, dims=dims, all_keys=True)])
    [meaning] = read.values()
    assert meaning.allowed.shape[-2:] == (1, min(4, CTX)) and meaning.allowed.all()
