"""One fuzz case: mutate a source around one site, check the mutant, fuse it under a guard, judge.

Outcomes (the first that applies):
  n/a       the site has nothing this mutation rewrites (not a case)
  invalid   the mutant is not a valid model ONNX Runtime runs, or a preserving mutation changed the
            outputs: a fuzzer bug, reported apart
  no_effect a meaning-changing mutation that does not change the outputs on the fuzzer's inputs
  crashed   trtattn.fuse raised, or a reason says "internal error"
  wrong     what fuse would write (its output model, also a partial one) differs from the mutant
  missed    an attention-like softmax with no report row, or left decomposed in the output unlisted
  listed    a site reported not fused, with its reason
  fused     every site fused; the output matches the mutant on the fuzzer's own inputs
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from trtattn import fuse as trtattn_fuse
from trtattn.graph.emit import export_like
from trtattn.report import verdict
from trtattn.site import SiteOutcome, SiteStatus
from trtattn.verify import Check, tolerance

from . import (
    changing,  # noqa: F401
    preserving,  # noqa: F401, I001  (registers the kinds: preserving first, for the table's order)
    softmax_forms,  # noqa: F401  (issue 18's kinds)
)
from .graphops import KINDS, Ctx, NotApplicable
from .sites import Facts, count_attention, facts, locate
from .sources import difference, feed_sets, load_source, metadata, run, session

# fused vs decomposed fp32 differ by ~1e-6, wrong answers by far more; a kind whose mutant computes its products
# in fp16 (graphops.Kind.precision) is held to the tolerance trtattn verifies fp16 attention at (verify/tolerance.py)
ATOL, RTOL = tolerance(Check.FUZZ, "fp32")
QUANT_ATOL = 8 / 255  # at most 8 steps of uint8 probabilities, where the fused op drops their Q/DQ
OUTCOMES = ("fused", "listed", "missed", "crashed", "wrong", "invalid", "no_effect", "n/a")




@dataclass
class Analysis:
    name: str
    model: onnx.ModelProto
    feeds: list[dict]
    outputs: list[dict]
    n_sites: int
    site_names: list[str]
    facts: Facts
    checker_error: str  # what onnx.checker says of the source itself ("" when it passes)


_ANALYSES: dict[str, Analysis | Exception] = {}  # per process


def _checker_error(model: onnx.ModelProto) -> str:
    try:
        onnx.checker.check_model(model)
        return ""
    except Exception as e:
        return _first_line(e)


def analyse(name: str) -> Analysis:
    cached = _ANALYSES.get(name)
    if isinstance(cached, Exception):
        raise cached
    if cached is None:
        try:
            cached = _ANALYSES[name] = _analyse(name)
        except Exception as e:
            _ANALYSES[name] = e
            raise
    return cached


def _analyse(name: str) -> Analysis:
    model = load_source(name)
    graph = gs.import_onnx(model)
    sites = locate(graph)
    expected = metadata(model).get("expected_sites", len(sites) or 1)
    if len(sites) != expected:
        raise ValueError(f"{name}: the fuzzer's locator finds {len(sites)} attention-like softmaxes, "
                         f"the zoo config says {expected}")
    feeds = feed_sets(model, seed=0)
    outputs = [run(model, f) for f in feeds]
    return Analysis(name, model, feeds, outputs, len(sites), [s.name for s in sites],
                    facts(model, sites, feeds), _checker_error(model))


@dataclass
class CaseResult:
    id: str
    source: str
    site: str
    kind: str
    variant: str
    preserving: bool
    outcome: str = "n/a"
    reason: str = ""
    site_name: str = ""
    max_err: float | None = None
    atol: float | None = None  # what the written model was held to
    sites: int = 0
    rows: int = 0
    fused_rows: int = 0
    cli_exit: int | None = None
    cli_problem: str = ""
    seconds: float = 0.0
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def case_id(source: str, site, kind: str, variant: str) -> str:
    return f"{source}/{site}/{kind}/{variant}"


def parse_case(cid: str) -> tuple[str, str, str, str]:
    parts = cid.split("/")
    if len(parts) != 4:
        raise ValueError(f"a case id is SOURCE/SITE/KIND/VARIANT, got '{cid}'")
    return parts[0], parts[1], parts[2], parts[3]


def mutate(a: Analysis, site: str, kind: str, variant: str) -> onnx.ModelProto:
    k = KINDS[kind]
    if k.whole_model:
        return k.fn(a.model, variant)
    graph = gs.import_onnx(a.model)
    sites = locate(graph)
    k.fn(Ctx(graph, sites[int(site)], a.facts, variant, kind, a.model))
    return export_like(graph, a.model)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _same(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    return a is b or a.SerializeToString() == b.SerializeToString()


def run_case(cid: str, *, cli: bool = False, save: Path | None = None, fuse: bool = True) -> CaseResult:
    """One case; with fuse=False only the mutant is made and checked (outcome "valid" if it passes)."""
    source, site, kind, variant = parse_case(cid)
    if kind not in KINDS:
        raise ValueError(f"unknown mutation kind '{kind}'; known: {', '.join(KINDS)}")
    k = KINDS[kind]
    res = CaseResult(cid, source, site, kind, variant, k.preserving)
    t0 = time.perf_counter()
    try:
        _judge(res, analyse(source), cli, save, fuse)
    finally:
        res.seconds = round(time.perf_counter() - t0, 3)
    return res


def _judge(res: CaseResult, a: Analysis, cli: bool, save: Path | None, fuse: bool) -> None:
    res.site_name = a.site_names[int(res.site)] if res.site.isdigit() else "(whole model)"
    try:
        mutant = mutate(a, res.site, res.kind, res.variant)
    except NotApplicable as e:
        res.outcome, res.reason = "n/a", str(e)
        return
    except Exception as e:
        res.outcome, res.reason = "invalid", f"the mutation raised {_first_line(e)}"
        res.notes.append(traceback.format_exc(limit=-3))
        return
    if save:
        save.mkdir(parents=True, exist_ok=True)
        onnx.save(mutant, str(save / "mutant.onnx"))
    # the mutant must be valid ONNX that ONNX Runtime runs, and mean what the kind says
    try:
        if not a.checker_error:  # a source the checker rejects (trtattn/testing/graphs.py's) holds its mutants to ONNX Runtime
            onnx.checker.check_model(mutant)
        sess = session(mutant)
        outs = [run(sess, f) for f in a.feeds]
    except Exception as e:
        res.outcome, res.reason = "invalid", f"the mutant does not load or run: {_first_line(e)}"
        return
    atol, rtol = tolerance(Check.FUZZ, KINDS[res.kind].precision)
    changed = [difference(o, ref, atol, rtol) for o, ref in zip(outs, a.outputs)]
    if res.preserving and not all(c[0] for c in changed):
        worst = max(changed, key=lambda c: c[1])
        res.outcome, res.reason = "invalid", f"a preserving mutation changed the outputs ({worst[2]}: {worst[1]:.3g})"
        return
    if not res.preserving and all(c[0] for c in changed):
        res.outcome = "no_effect"
        res.reason = f"the outputs did not change (max {max(c[1] for c in changed):.3g})"
        return
    decomposed, fused_ops = count_attention(mutant)
    res.sites = decomposed + fused_ops
    if res.sites != a.n_sites:
        res.outcome, res.reason = "invalid", f"the mutant has {res.sites} attention-like softmaxes, the source {a.n_sites}"
        return
    if not fuse:
        res.outcome = "valid"
        return
    try:
        result = trtattn_fuse(mutant)
    except Exception as e:
        res.outcome, res.reason = "crashed", _first_line(e)
        res.notes.append(traceback.format_exc(limit=-4))
        return
    if save:
        onnx.save(result.model, str(save / "fused.onnx"))
    _classify(res, a, mutant, outs, result)
    if cli:
        _check_cli(res, mutant)


def _site_row(rows: list[SiteOutcome], site_name: str) -> SiteOutcome | None:
    name = site_name.strip("/")
    for r in rows:
        n = r.site.name.strip("/")
        if n and (n == name or name.startswith(n + "/")):
            return r
    return None


def _tolerance(mutant: onnx.ModelProto, rows: list, kind: str) -> tuple[float, float]:
    """(atol, rtol): the kind's precision's (Check.FUZZ), or the atol a fused row states for a
    quantized site (the fused op drops the rounding of Q/DQ on the probabilities), checked here: honoured
    only in a model that has Q/DQ, and never above QUANT_ATOL."""
    atol, rtol = tolerance(Check.FUZZ, KINDS[kind].precision)
    stated = max([0.0] + [r.tolerance or 0.0 for r in rows if r.status == SiteStatus.FUSED])
    if stated and any(n.op_type == "QuantizeLinear" for n in mutant.graph.node):
        return max(atol, min(stated, QUANT_ATOL)), rtol
    return atol, rtol


def _classify(res: CaseResult, a: Analysis, mutant, outs, result) -> None:
    rows = result.reports  # fuse's SiteReports
    res.rows = len(rows)
    res.fused_rows = sum(r.status == SiteStatus.FUSED for r in rows)
    listed = [r for r in rows if r.status != SiteStatus.FUSED]
    internal = [r for r in listed if "internal error" in r.reason.lower()]
    if internal:
        res.outcome, res.reason = "crashed", f"{internal[0].site.name}: {internal[0].reason}"
        return
    written = None if _same(result.model, mutant) else result.model
    remaining = None
    if written is not None:  # what `fuse` writes (or would, with --allow-partial)
        try:
            fused_outs = [run(written, f) for f in a.feeds]
        except Exception as e:
            res.outcome, res.reason = "wrong", f"the written model does not run: {_first_line(e)}"
            return
        atol, rtol = _tolerance(mutant, rows, res.kind)
        res.atol = atol
        diffs = [difference(f, o, atol, rtol) for f, o in zip(fused_outs, outs)]
        res.max_err = max(d[1] for d in diffs)
        if not all(d[0] for d in diffs):
            worst = max(diffs, key=lambda d: d[1])
            state = "ok" if result.ok else "partial"
            res.outcome = "wrong"
            res.reason = f"fuse ({state}) wrote a model that differs from its input: {worst[2]} max abs {worst[1]:.3g}"
            return
        remaining = count_attention(written)[0]
    silent = res.sites - len(rows)
    if silent > 0:
        ignored = "; ".join(f"{i.name}: {i.reason}" for i in result.ignored)[:200]
        res.outcome = "missed"
        res.reason = (f"{res.sites} attention-like softmaxes, {len(rows)} report rows"
                      + (f" (ignored: {ignored})" if ignored else ""))
        return
    if remaining is not None and remaining > len(listed):
        res.outcome = "missed"
        res.reason = f"the output still has {remaining} decomposed attentions, {len(listed)} listed"
        return
    if listed or not result.ok:
        mine = _site_row(listed, res.site_name) or (listed[0] if listed else None)
        res.outcome = "listed"
        res.reason = f"{mine.site.name}: {mine.reason}" if mine else f"verification: {verdict(result.verification)}"
        return
    if written is None and res.sites:
        res.outcome, res.reason = "missed", "every row says fused but the model is unchanged"
        return
    res.outcome = "fused"


# ------------------------------------------------------------------ the CLI's exit code
def _cli(args: list[str]) -> tuple[int, str]:
    from trtattn.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return int(code or 0), out.getvalue() + err.getvalue()


_ALLOW_PARTIAL: bool | None = None


def allow_partial_supported() -> bool:
    global _ALLOW_PARTIAL
    if _ALLOW_PARTIAL is None:
        _ALLOW_PARTIAL = "--allow-partial" in _cli(["fuse", "--help"])[1]
    return _ALLOW_PARTIAL


def _check_cli(res: CaseResult, mutant: onnx.ModelProto) -> None:
    """`trtattn fuse` exits 0 only when every site fused and verified, non-zero when a site is
    listed or missed (0 with --allow-partial when a site is listed), never 3 (internal error)."""
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "mutant.onnx", Path(d) / "fused.onnx"
        onnx.save(mutant, str(src))
        code, text = _cli(["-q", "fuse", str(src), "-o", str(out)])
        res.cli_exit = code
        problems = []
        if code == 3 or "internal error" in text:
            problems.append("internal error")
        if res.outcome == "fused" and code != 0:
            problems.append(f"exit {code} although every site fused")
        if res.outcome in ("listed", "missed") and code == 0:
            problems.append(f"exit 0 with a site {res.outcome}")
        if (code == 0) != out.exists():
            problems.append(f"exit {code} but the output {'was' if out.exists() else 'was not'} written")
        if res.outcome == "listed" and allow_partial_supported():
            partial = Path(d) / "partial.onnx"
            code2, _ = _cli(["-q", "fuse", str(src), "-o", str(partial), "--allow-partial"])
            if code2 != 0:
                problems.append(f"--allow-partial exits {code2} with a listed site")
        res.cli_problem = "; ".join(problems)
