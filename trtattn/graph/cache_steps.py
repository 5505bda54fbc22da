"""The cache lengths a site reading a cache the graph appends to is verified at, beside the fitted dims.

A graph input concatenated onto a site's keys along their key axis is a past (match/cache.py finds it from the
matched site's axes, whatever its name), as a contrib op's past_key is (graph/op_dims.py, whose prefill
graph/dims.py adds). At one set of dims a mask may read one way that another length reads otherwise: openai-whisper's
`mask[:n, :n]` over a cache cut to its last n_ctx positions is square at n = t = n_ctx, where top-left and
bottom-right causal agree, and (1, 1) at a later step, where it broadcasts over every key. So such a site is also
verified at a prefill (every such cache empty) and at a decode step (one new token over a non-empty cache: more keys
than queries), where the model runs there (`Fit.also`, which verification and the mask probes read).
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from .dim_names import resolve_dims
from .dims import Fit, show, trial
from .roles import input_specs


def with_cache_steps(model: onnx.ModelProto, fit: Fit, pasts: Mapping[str, str | None],
                     user: Mapping | None = None) -> Fit:
    """`fit` (not changed) with a prefill and a decode step added to its `also` for the caches `pasts` names (a
    cache's length dim -> its new tokens' length dim, None where no input dim names it), each where the model runs
    there and it is not already verified; dims the user gave stay as given. Said in the reasons either way."""
    user = dict(user or {})
    free = {p: n for p, n in pasts.items() if p in fit and p not in user}
    out = Fit(fit, fit.reasons, fit.skipped, fit.runs, fit.one_key, fit.also)
    if not free:
        return out
    steps = [("a prefill (empty cache)", {p: 0 for p in free})]
    news = {n for n in free.values() if n is not None and n in fit and n not in user}
    if len(news) == len(set(free.values())):
        # over the fitted past, or the prompt's length where the fit is a first step (an empty cache) itself
        steps.append(("a decode step (one new token over a cache)",
                      {**{p: fit[p] or fit[n] for p, n in free.items() if n is not None}, **{n: 1 for n in news}}))
    else:
        out.reasons.append(f"not verified at a decode step: no input dim names the new keys of "
                           f"{', '.join(sorted(free))}, or it was given")
    specs = input_specs(model)
    seen = [dict(fit)] + [dict(d) for d in fit.also]
    todo = []
    for what, change in steps:
        dims = resolve_dims(model, {**fit, **change}, specs=specs)
        if all(dims != s for s in seen):
            todo.append((what, dims, change))
    if not todo:
        return out
    with trial(model, specs) as run:
        for what, dims, change in todo:
            problem, _ = run(dims)
            if problem is None:
                out.also.append(dims)
                out.reasons.append(f"also verified at {what}: {show(dims, change)}")
            else:
                out.reasons.append(f"not verified at {what} too: at {show(dims, change)} {problem}")
    return out

