"""Planning, parallel runs and the tables of the mutation fuzzer.

Case slots go round-robin over the mutation kinds, so every kind gets the same share. Each kind's
candidate cases (source x site x variant) are shuffled by the seed and dealt to its slots in disjoint
stripes; a slot runs the first of its stripe that applies. The result is the same whatever --jobs
is, and every case has an id (SOURCE/SITE/KIND/VARIANT) that `--case` reruns on its own.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter, defaultdict

import numpy as np

from .graphops import KINDS
from .oracle import OUTCOMES, CaseResult, case_id, run_case
from .sources import load_source

MAX_DRAWS = 40  # candidates a slot tries before it gives up as n/a
SEVERITY = ("crashed", "wrong", "invalid", "missed", "no_effect", "listed", "n/a")


def candidates(kind: str, sources: list[str], sites: dict[str, int], seed: int) -> list[str]:
    """Every (source, site, variant) case id of one kind, in a seeded order."""
    k = KINDS[kind]
    ids = [case_id(s, site, kind, v) for s in sources for v in k.variants
           for site in (["all"] if k.whole_model else range(sites[s]))]
    order = np.random.default_rng([seed, list(KINDS).index(kind)]).permutation(len(ids))
    return [ids[i] for i in order]


def draw(kind: str, stripe: list[str], cli: bool) -> CaseResult:
    """The first case of a slot's stripe of candidates that applies to its site."""
    last, unusable = None, []
    for cid in stripe[:MAX_DRAWS]:
        try:
            last = run_case(cid, cli=cli)
        except Exception as e:  # the source could not be analysed
            unusable.append(f"source {cid.split('/')[0]} unusable: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        if last.outcome != "n/a":
            last.notes += unusable
            return last
    if last is None:
        last = CaseResult(f"-/-/{kind}/-", "-", "-", kind, "-", KINDS[kind].preserving,
                          reason="no candidate left" if not stripe else "no usable source")
    last.outcome, last.notes = "n/a", last.notes + unusable
    last.reason = f"no applicable case in {min(len(stripe), MAX_DRAWS)} draws (last: {last.reason})"
    return last


def _draw_slot(args) -> CaseResult:
    try:
        return draw(*args)
    except Exception as e:  # a fuzzer bug must not cost the run: it is reported as an invalid case
        kind, stripe, _ = args
        return CaseResult(stripe[0] if stripe else f"-/-/{kind}/-", "-", "-", kind, "-", KINDS[kind].preserving,
                          outcome="invalid", reason=f"the fuzzer raised {type(e).__name__}: {e}")


def site_counts(sources: list[str]) -> dict[str, int]:
    """Attention sites per source (exporting missing zoo models once, here, before workers race to
    write the same file): the zoo's count from its config, else the fuzzer's locator."""
    import onnx_graphsurgeon as gs

    from .sites import locate
    from .sources import metadata

    out = {}
    for s in sources:
        model = load_source(s)
        out[s] = metadata(model).get("expected_sites") or len(locate(gs.import_onnx(model)))
    return out


def plan(cases: int, seed: int, sources: list[str], cli_every: int = 10,
         kinds=None) -> list[tuple[str, list[str], bool]]:
    """Slots round-robin over the kinds; slot j of a kind with n slots tries that kind's candidates
    j, j + n, j + 2n, ... (disjoint stripes: no case twice)."""
    kinds = list(kinds or KINDS)
    per_kind = {k: [i for i in range(cases) if kinds[i % len(kinds)] == k] for k in kinds}
    sites = site_counts(sources)
    stripes = {}
    for k, slots in per_kind.items():
        if slots:
            pool = candidates(k, sources, sites, seed)
            for j, i in enumerate(slots):
                stripes[i] = pool[j::len(slots)]
    return [(kinds[i % len(kinds)], stripes[i], cli_every > 0 and i % cli_every == 0) for i in range(cases)]


def run(cases: int, seed: int, jobs: int, sources: list[str], cli_every: int = 10, progress=None,
        kinds=None) -> list[CaseResult]:
    slots = plan(cases, seed, sources, cli_every, kinds)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    if jobs <= 1:
        for i, s in enumerate(slots):
            results.append(_draw_slot(s))
            if progress:
                progress(i + 1, cases, results[-1])
        return results
    with multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=200) as pool:
        for i, r in enumerate(pool.imap(_draw_slot, slots, chunksize=1)):
            results.append(r)
            if progress:
                progress(i + 1, cases, r)
    return results


# ------------------------------------------------------------------ tables
COLUMNS = ("fused", "listed", "missed", "crashed", "wrong", "invalid", "no_effect", "n/a")
HEADERS = ("fused", "listed not fused", "missed", "crashed", "wrong-and-written", "invalid mutation",
           "no effect", "n/a")


def counts(results: list[CaseResult]) -> dict[str, Counter]:
    per: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        per[r.kind][r.outcome] += 1
    return per


def fused_share(c: Counter) -> float | None:
    cases = sum(c[o] for o in OUTCOMES if o != "n/a")
    return c["fused"] / cases if cases else None


def _row(name: str, meaning: str, c: Counter) -> list[str]:
    cases = sum(c[o] for o in OUTCOMES if o != "n/a")
    share = fused_share(c)
    return [name, meaning, str(cases)] + [str(c[o]) for o in COLUMNS] + [f"{100 * share:.1f}%" if share is not None else "-"]


def table(results: list[CaseResult]) -> str:
    per = counts(results)
    header = ["kind", "keeps meaning", "cases", *HEADERS, "fused %"]
    rows = []
    totals: dict[bool, Counter] = {True: Counter(), False: Counter()}
    for name, k in KINDS.items():
        if name in per:
            rows.append(_row(name, "yes" if k.preserving else "no", per[name]))
            totals[k.preserving].update(per[name])
    rows.append(_row("**meaning-preserving**", "yes", totals[True]))
    rows.append(_row("**meaning-changing**", "no", totals[False]))
    rows.append(_row("**all**", "", totals[True] + totals[False]))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def failures(results: list[CaseResult], limit: int = 60, with_listed: bool = True) -> str:
    bad = [r for r in results if r.outcome in SEVERITY[:-1] and (with_listed or r.outcome != "listed")
           and not (r.outcome == "listed" and not r.preserving)]
    bad.sort(key=lambda r: (SEVERITY.index(r.outcome), r.kind, r.id))
    lines = [f"{r.outcome:9s} {r.id}  [{r.site_name}]  {r.reason}" for r in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"... {len(bad) - limit} more (--json FILE has them all)")
    return "\n".join(lines)


def cli_summary(results: list[CaseResult]) -> str:
    checked = [r for r in results if r.cli_exit is not None]
    wrong = [r for r in checked if r.cli_problem]
    text = f"CLI (`trtattn fuse` exit code) checked on {len(checked)} cases: {len(wrong)} disagree"
    return text + "".join(f"\n  {r.id}: {r.cli_problem}" for r in wrong[:20])


def error_summary(results: list[CaseResult]) -> str:
    from .oracle import ATOL

    fused = [r for r in results if r.outcome == "fused" and r.max_err is not None]
    half = [r.max_err or 0.0 for r in fused if KINDS[r.kind].precision == "fp16"]
    fused = [r for r in fused if KINDS[r.kind].precision != "fp16"]
    plain = [r.max_err or 0.0 for r in fused if (r.atol or ATOL) <= ATOL]
    quant = [(r.atol or ATOL, r.max_err or 0.0) for r in fused if (r.atol or ATOL) > ATOL]
    text = (f"fused outputs vs their mutants on the fuzzer's inputs (atol {ATOL:g}): max abs error "
            f"{max(plain, default=0):.2g} (median {float(np.median(plain)) if plain else 0:.2g}) over {len(plain)} cases")
    if quant:
        text += (f"; {len(quant)} cases with quantized probabilities held to the tolerance their report row "
                 f"states ({min(a for a, _ in quant):.3g}-{max(a for a, _ in quant):.3g}): max abs error "
                 f"{max(e for _, e in quant):.2g}")
    if half:
        text += f"; {len(half)} cases with fp16 products (fp16's tolerance): max abs error {max(half):.2g}"
    return text


def unusable_sources(results: list[CaseResult]) -> list[str]:
    return sorted({n for r in results for n in r.notes if n.startswith("source ")})
