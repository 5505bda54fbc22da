"""A recorded network on trtsim's numpy executor against the original model on ONNX Runtime: the reference
check tests/routes' build tests share (a helper, so no test file imports another)."""

import numpy as np

from trtattn.rewrite.precision import cpu_runner
from trtattn.routes.prepare import form_adapter
from trtattn.trt.network import build_network


def reference_errors(trt, prepared, original, dims=None, seed=0) -> dict[str, tuple[float, float]]:
    """The recorded network on trtsim's executor against the original on ONNX Runtime:
    {output: (max abs error, that over the output's largest value)}."""
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = build_network(trt, builder, trt.Logger(trt.Logger.WARNING), prepared.cut, prepared.plan)
    from trtsim.execute import run

    adapter = form_adapter(original, [i.name for i in prepared.plan.inputs],
                           [c.cache for c in prepared.plan.cache_updates], prepared.plan.limits.max_cache)
    feeds = adapter.original_feeds(dims, seed)
    ref = cpu_runner(original)[0](feeds)
    types = {t._name: t._dtype for t in network._inputs}
    from trtsim.dtypes import to_numpy

    out = run(network, {k: np.asarray(v).astype(to_numpy(types[k])) for k, v in adapter.feeds(feeds).items()})
    ref, out = adapter.line_up(feeds, ref, out)
    return {k: _errors(ref[k], out[k]) for k in ref if k in out}


def _errors(a, b) -> tuple[float, float]:
    """(max abs error, that over the reference's largest finite value); masked logits agree (-inf in one, the
    type's lowest in the other: ONNX Runtime's qk_matmul_output), as the verifier has them (max_abs_error)."""
    from trtattn.verify.compare import max_abs_error

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or (np.isnan(a) != np.isnan(b)).any():
        return float("inf"), float("inf")
    if not a.size:
        return 0.0, 0.0
    err = max_abs_error(a, b)
    finite = np.abs(a[np.isfinite(a)].astype(np.float64))
    return err, err / max(float(finite.max(initial=0.0)), 1e-12)
