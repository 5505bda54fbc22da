"""openai-whisper's cache as the seed writes it (issue 32): new K/V appended with torch.cat, the last CTX kept,
caches stacked one tensor per kind, and the causal buffer sliced mask[:n, :n] by the new tokens only. At a later
step that slice is (1, 1) and broadcasts over every key, so the mask reads differently at each cache length."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from trtattn.rewrite.fuse import fuse_model
from trtattn.site import SiteStatus
from trtattn.testing.exports import export_module

torch = pytest.importorskip("torch")

D, H, CTX = 16, 2, 8


def _seed_model(whisper_style: bool = False):
    """The seed's cache; `whisper_style`: as openai-whisper writes it, the cache unbound from its stack (TorchScript
    writes Split + Squeeze, not a Gather) and K scaled by head_size ** -0.25 before its product, as Q is."""
    class Seed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))
            self.register_buffer("mask", torch.empty(CTX, CTX).fill_(-float("inf")).triu_(1))

        def forward(self, x, kc, vc):
            n = x.shape[1]
            kc0, vc0 = (kc.unbind(0)[0], vc.unbind(0)[0]) if whisper_style else (kc[0], vc[0])
            k = torch.cat([kc0, self.k(x)], 1)[:, -CTX:]
            v = torch.cat([vc0, self.v(x)], 1)[:, -CTX:]

            def heads(t):
                return t.view(t.shape[0], t.shape[1], H, D // H).permute(0, 2, 1, 3)

            if whisper_style:
                quarter = (D // H) ** -0.25
                w = (heads(self.q(x)) * quarter) @ (heads(k) * quarter).transpose(-1, -2) + self.mask[:n, :n]
            else:
                w = heads(self.q(x)) @ heads(k).transpose(-1, -2) * (D // H) ** -0.5 + self.mask[:n, :n]
            y = (w.softmax(-1) @ heads(v)).permute(0, 2, 1, 3).reshape(x.shape)
            return self.o(y), torch.stack([k]), torch.stack([v])

    empty = torch.zeros(1, 1, 0, D)
    return export_module(Seed(), (torch.randn(1, 3, D), empty, empty), ["x", "kc", "vc"],
                         {"x": {1: "n"}, "kc": {2: "t"}, "vc": {2: "t"}}, output_names=["y", "k", "v"])


def _decode(model, lengths=(3, 1, 1)) -> list[np.ndarray]:
    """Each step fed the caches the step before returned, from an empty cache."""
    session = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(1)
    kc = vc = np.zeros((1, 1, 0, D), np.float32)
    out = []
    for n in lengths:
        x = rng.standard_normal((1, n, D)).astype(np.float32)
        y, kc, vc = session.run(None, {"x": x, "kc": kc, "vc": vc})
        out.append(y)
    return out


def _fused_right(model, result, lengths=(3, 1, 1)) -> list[float]:
    """The site came back fused and verified, and the written model equals the original at each step of a decode
    from an empty cache: the errors, each asserted below 1e-4."""
    assert [r.status for r in result.reports] == [SiteStatus.FUSED], [r.reason for r in result.reports]
    assert result.verification.passed
    errors = [float(np.abs(a - b).max()) for a, b in zip(_decode(model, lengths), _decode(result.model, lengths))]
    assert max(errors) < 1e-4, errors
    return errors


def test_seed_cache_fused_and_right_at_later_steps():
    """Fitted at n = t = CTX (the window keeps the new keys only, square), the site is also verified at a prefill
    (t = 0) and a decode step (n = 1 over t = CTX: more keys than queries), where its (1, 1) mask broadcasts over
    every key: written with that mask as the graph evaluates it, it is right at every step."""
    model = _seed_model()
    result = fuse_model(model)
    _fused_right(model, result)
    also = result.dims["also_verified_at"]
    assert {(d["n"], d["t"]) for d in also} == {(CTX, 0), (1, CTX)}, also
    assert any("decode step" in why for why in result.dims["why"])


def test_whisper_style_seed_cache_is_found_through_the_stack_split_and_the_scaled_keys():
    """openai-whisper's own decoder: its cache is unbound from the stack (Split + Squeeze) and K is scaled before its
    product. The cache is still found, so the site is verified at a decode step and right at every step (it was
    fused causal upper-left from the square fit alone, and wrong by 1.2 at the next step)."""
    model = _seed_model(whisper_style=True)
    assert {"Split", "Squeeze"} <= {n.op_type for n in model.graph.node}
    result = fuse_model(model)
    _fused_right(model, result)
    assert any(d["n"] == 1 and d["t"] > 0 for d in result.dims["also_verified_at"]), result.dims


def test_seed_cache_at_a_decode_step_is_fused_with_the_mask_as_evaluated():
    """At one new token over a past (n=1, t=3) the mask is the (1, 1) slice: read as the graph evaluates it, not as
    the n x n causal read at a square step, it is right at the later steps (the op reads it over every key)."""
    model = _seed_model()
    result = fuse_model(model, dims={"n": 1, "t": 3})
    _fused_right(model, result, lengths=(3, 1, 1, 1))


def test_seed_cache_given_one_step_still_tries_a_decode_step(tmp_path):
    """--inputs with the first step only (an empty cache): the decode step over the prompt's past is still verified,
    and the verification says it drew those inputs."""
    from trtattn.graph.user_inputs import GivenInputs

    model = _seed_model()
    rng = np.random.default_rng(2)
    first = {"x": rng.standard_normal((1, 3, D)).astype(np.float32), "kc": np.zeros((1, 1, 0, D), np.float32),
             "vc": np.zeros((1, 1, 0, D), np.float32)}
    result = fuse_model(model, inputs=GivenInputs(str(tmp_path / "first.npz"), [first]))
    _fused_right(model, result)
    assert [(d["n"], d["t"]) for d in result.dims["also_verified_at"]] == [(1, 3)]
    assert result.verification.iterations == 2
    assert any("other cache lengths" in note for note in result.verification.inputs.notes)
