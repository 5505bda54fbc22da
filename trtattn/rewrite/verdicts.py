"""How fuse judges a verification, site by site: the reasons a site is not fused, and the record kept."""

from __future__ import annotations

from ..site_names import names_site
from ..verify import Verification


def summary(outcome, why: str) -> Verification:
    summary = outcome.summary()
    summary.tolerance_why = why or None
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
