"""How fuse judges a verification, site by site: the reasons a site is not fused, and the record kept."""

from __future__ import annotations

from dataclasses import dataclass

from ..site import AttentionSite, SiteOutcome, SiteStatus
from ..site_names import names_site
from ..verify import Verification


def summary(outcome, why: str) -> Verification:
    summary = outcome.summary()
    summary.tolerance_why = "; ".join(w for w in (why, outcome.why) if w) or None
    return summary


def site_error(r, outcome) -> float | None:
    """A site's max abs error: of its output, or for a site inside a subgraph (whose tensors are not model
    outputs) of the model's outputs, which it feeds."""
    if r.site.graph:
        return max(outcome.output_errors.values(), default=None)
    return outcome.site_errors.get(r.site.output)


def output_reason(outcome) -> str:
    if not outcome.output_errors:
        return "within its own bound, but no model output could be compared: the original is kept"
    if outcome.shapes_differ:
        name, (was, now) = next(iter(outcome.shapes_differ.items()))
        return (f"within its own bound, but the model's output '{name}' has shape {now} where the original's is "
                f"{was}: the original is kept")
    worst = max(outcome.output_errors, key=lambda k: outcome.output_errors[k] / max(outcome.bounds.get(k, 1e-30), 1e-30))
    err, bound = outcome.output_errors[worst], outcome.bounds.get(worst, outcome.atol)
    nan = f"; NaN where the original has none: {', '.join(outcome.nan_mismatch)}" if outcome.nan_mismatch else ""
    return (f"within its own bound, but the model's output '{worst}' is off by {err:.3g} (bound {bound:.3g}"
            f"{', in ' + str(outcome.slices) + ' slices of layers' if outcome.slices else ''}{nan}): "
            "the original is kept")


def blame(error: Exception, active: list) -> list:
    """The sites whose nodes (named trtattn/SITE/...) an ONNX Runtime error names; all of them if none."""
    text = str(error)
    named = [r for r in active if names_site(text, r.site.name)]
    return named or active


def first_line(e: Exception) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()]
    text = lines[0] if lines else type(e).__name__
    return text if len(text) < 300 else text[:300] + "..."


def verify_reason(r, outcome=None) -> str:
    differ = outcome.shapes_differ.get(r.site.output) if outcome is not None else None
    if differ is not None:
        return f"verification failed: its output has shape {differ[1]} where the original's is {differ[0]}"
    if r.max_abs_err is None:
        return "verification could not compare this site's output"
    return f"verification failed: max abs error {r.max_abs_err:.3g} against the original"


# ---------------------------------------------------------------- what a failing site tries next
@dataclass(frozen=True)
class Fallback:
    """A decision about one site that failed: try it again as `site` (less written as ops), or with no site to try
    keep it as it was, for `reason`."""

    outcome: SiteOutcome
    site: AttentionSite | None
    reason: str = ""

    def apply(self) -> None:
        if self.site is not None:
            self.outcome.site = self.site
        else:
            self.outcome.refuse(SiteStatus.NOT_FUSED, self.reason)


def fallback(outcome: SiteOutcome, reason: str) -> Fallback:
    """A failing site tries again with less written as ops: its rotation left as the graph computes it, else the
    logits it returns computed beside the op instead of as its qk_matmul_output; else it is not fused, for `reason`."""
    site = rotation_dropped(outcome.site) or logits_beside(outcome.site)
    return Fallback(outcome, site, reason)


def logits_beside(site: AttentionSite) -> AttentionSite | None:
    """The site with the logits it returns computed beside the op; None when it returns none, or only the
    probabilities (which have no other way out of the op)."""
    if site.qk_output is None or site.qk_mode == 3:
        return None
    notes = tuple(n for n in site.notes if not n.startswith("its logits, which the model returns"))
    return site.replace(qk_output=None, qk_mode=None, notes=(*notes, f"the logits it returns, as the op's "
                                                                     f"qk_matmul_output (mode {site.qk_mode}), did "
                                                                     "not verify: computed beside the op"))


def rotation_dropped(site: AttentionSite) -> AttentionSite | None:
    """The site with the rotation fuse would write as RotaryEmbedding ops left as the graph computes it (the
    attention alone may still fuse); None when there is none to drop."""
    rope = site.rope
    if rope is None or not rope.op_caches:
        return None
    return site.replace(rope=None, notes=(*site.notes, "its rotation, read as RotaryEmbedding, did not verify: "
                                                       "left as the graph computes it"))
