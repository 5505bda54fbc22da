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



def test_the_masks_of_a_padded_llama_are_read_without_its_weights(tmp_path, monkeypatch):
    """The logits' query and key lengths are named as the inputs' dims: the probe reads them off the inputs, not
    off the logits, whose computation reads every earlier layer's weights (an 8B's 16 GB in one session)."""
    from trtattn.graph import io
    from trtattn.graph.evaluate import cut_out
    from trtattn.match import probe
    from trtattn.testing.write_llama import PRESETS, write_llama

    model = io.load(write_llama(tmp_path / "llama.onnx", **PRESETS["tiny"]), load_external_data=False)
    read_weights = []

    def counting(graph, outputs, like, **kwargs):  # the projections in the session the probe opens
        read_weights.append(sum(n.op_type == "MatMul" for n in cut_out(graph, outputs, like).graph.node))
        return real(graph, outputs, like, **kwargs)

    real = probe.bounded_evaluator
    monkeypatch.setattr(probe, "bounded_evaluator", counting)
    graph = import_graph(model)
    view = GraphView(graph, model)
    sites = match(graph, view).sites
    feeds = [make_feeds(model, dims=resolve_dims(model, {}), all_keys=True)]
    [read] = probe_masks(graph, model, sites, feeds, view=view)
    assert sorted(read) == sorted(s.name for s in sites) and len(sites) == 2
    assert {(m.pattern, m.causal, m.padding) for m in read.values()} == {("causal", CausalKind.UPPER_LEFT, True)}
    [without_view] = probe_masks(graph, model, sites, feeds)  # read off the logits: the same meaning, at a cost
    assert {k: (m.pattern, m.causal) for k, m in without_view.items()} == {k: (m.pattern, m.causal) for k, m in read.items()}
    assert read_weights[0] == 0 and read_weights[1] >= 8  # layer 0's q, k, v, o, MLP and its Q.K^T at least


def test_masks_read_off_the_logits_of_a_model_over_the_slicing_budget_are_probed_in_slices(tmp_path, monkeypatch):
    """Where the view cannot name the logits' lengths, the probe reads them off the logits: over the slicing
    budget that runs one session per slice of layers (here 1 MB of weights each), never one over every layer, and
    reads the same meanings as one session does."""
    from trtattn import timings
    from trtattn.graph import io
    from trtattn.testing.write_llama import write_llama

    path = write_llama(tmp_path / "llama.onnx", layers=4, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=512,
                       max_positions=64, dtype="float16")  # 5 MB of weights
    model = io.load(path, load_external_data=False)
    graph = import_graph(model)
    sites = match(graph, GraphView(graph, model)).sites
    feeds = [make_feeds(model, dims=resolve_dims(model, {}), all_keys=True)]
    readings = []
    for budget_mb in ("0", "1"):  # 0: never sliced
        monkeypatch.setenv("TRTATTN_SLICE_MB", budget_mb)
        with timings.recording() as recorder:
            [read] = probe_masks(graph, model, sites, feeds)
        readings.append(({k: (m.pattern, m.causal, m.padding) for k, m in read.items()}, recorder.timings.sessions))
    (whole, one_session), (sliced, sessions) = readings
    assert len(whole) == len(sites) == 4 and set(whole.values()) == {("causal", CausalKind.UPPER_LEFT, True)}
    assert sliced == whole and one_session == 1 and sessions >= 4
