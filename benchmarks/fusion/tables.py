"""The printed tables: coverage and cost per model, per-layer cost, large models against the targets."""

from __future__ import annotations

from pathlib import Path

from .measure import PEERS, TOOLS

NAMES = {"floor": "load + save (floor)", "trtattn": "trtattn fuse (verified)",
         "trtattn_noverify": "trtattn fuse (no verification)",
         "ort_optimizer": "ONNX Runtime optimizer", "onnxscript": "onnxscript rewriter"}


def fmt_s(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def _fmt_fused(row, tool) -> str:
    n = row["fused"].get(tool)
    if n is None:
        return "-"
    s = str(n)
    if tool in row["errors"]:
        s += " (err)"
    det = row["details"].get(tool, {})
    if det.get("output_matches_original") is False:
        s += " (wrong)"
    elif det.get("check_error"):
        s += " (invalid)"
    return s


def _correct(row, tool) -> bool:
    """A peer's fusions count as correct when its output model runs and matches the original."""
    det = row["details"].get(tool, {})
    return tool not in row["errors"] and det.get("output_matches_original") is not False and not det.get("check_error")


def fastest_peer(row) -> float | None:
    s = row["seconds"]
    peers = [s[p] for p in PEERS if s.get(p) is not None and p not in row["errors"]]
    return min(peers) if peers else None


def ratio(row, tool) -> float:
    """`tool`'s seconds over the fastest peer's (0 when either is missing)."""
    peer, mine = fastest_peer(row), row["seconds"].get(tool)
    return mine / max(peer, 1e-3) if peer and mine is not None else 0.0


def coverage_table(rows: list[dict]) -> str:
    head = ("| model | exporter | sites | already fused in input | trtattn (verified) | ORT optimizer | onnxscript "
            "| floor s | trtattn s | trtattn no-verify s | ORT s | onnxscript s | no-verify / fastest peer "
            "| floor MB | trtattn MB | no-verify MB | ORT MB | onnxscript MB |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        s, p = r["seconds"], r["peak_mb"]
        lines.append("| " + " | ".join([
            r["model"], r["exporter"], str(r["sites"]), str(r.get("already_fused", 0)),
            _fmt_fused(r, "trtattn"), _fmt_fused(r, "ort_optimizer"), _fmt_fused(r, "onnxscript"),
            fmt_s(s.get("floor")), fmt_s(s.get("trtattn")), fmt_s(s.get("trtattn_noverify")),
            fmt_s(s.get("ort_optimizer")), fmt_s(s.get("onnxscript")),
            f"{ratio(r, 'trtattn_noverify'):.2f}x" if ratio(r, "trtattn_noverify") else "-",
            *(f"{p.get(t):.0f}" if p.get(t) is not None else "-" for t in TOOLS)]) + " |")
    tot = {t: sum(r["fused"].get(t, 0) for r in rows) for t in ("trtattn", "ort_optimizer", "onnxscript")}
    good = {t: sum(r["fused"].get(t, 0) for r in rows if _correct(r, t)) for t in PEERS}
    new = {t: sum(max(0, r["fused"].get(t, 0) - r.get("already_fused", 0)) for r in rows if _correct(r, t))
           for t in ("trtattn",) + PEERS}
    sites = sum(r["sites"] for r in rows)
    pre = sum(r.get("already_fused", 0) for r in rows)
    faster = sum(0 < ratio(r, "trtattn_noverify") < 1 for r in rows)
    lines.append(f"| **total** | | **{sites}** | {pre} | **{tot['trtattn']}** | "
                 f"**{tot['ort_optimizer']}** ({good['ort_optimizer']} correct) | **{tot['onnxscript']}** "
                 f"({good['onnxscript']} correct) |" + " |" * 5 + f" faster on {faster} of {len(rows)} |" + " |" * 5)
    lines.append(f"| **correct, beyond those already fused in the input** | | **{sites - pre}** | | **{new['trtattn']}** | "
                 f"**{new['ort_optimizer']}** | **{new['onnxscript']}** |" + " |" * 11)
    return "\n".join(lines)


def scaling_table(rows: list[dict]) -> str:
    """Seconds per tool and the marginal seconds per added layer ((t_n - t_prev) / (n - prev)): a flat
    marginal cost is linear scaling; the fixed cost (imports, sessions) sits in the first row. The last
    line gives, per tool, how far the largest marginal cost is above the smallest."""
    tools = ("trtattn", "trtattn_noverify", "ort_optimizer", "onnxscript", "floor")
    lines = ["| layers | sites | trtattn fused | " + " | ".join(f"{t} s | s/layer" for t in tools) + " | trtattn MB |",
             "|" + "|".join(["---"] * (4 + 2 * len(tools))) + "|"]
    marginal: dict[str, list[float]] = {t: [] for t in tools}
    prev = None
    for r in sorted(rows, key=lambda r: r["layers"]):
        n, s = r["layers"], r["seconds"]
        cells = [str(n), str(r["sites"]), str(r["fused"].get("trtattn"))]
        for t in tools:
            cells.append(fmt_s(s.get(t)))
            if prev is not None and s.get(t) is not None and prev["seconds"].get(t) is not None:
                m = (s[t] - prev["seconds"][t]) / (n - prev["layers"])
                marginal[t].append(m)
                cells.append(f"{m:.3f}")
            else:
                cells.append("-")
        cells.append(f"{r['peak_mb'].get('trtattn', 0):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
        prev = r
    spread = []
    for t in tools:
        m = [x for x in marginal[t] if x > 0]
        spread.append(f"{100 * (max(m) / min(m) - 1):.0f}%" if len(m) > 1 else "-")
        spread.append("")
    lines.append("| **largest / smallest s per layer** | | | " + " | ".join(spread) + " |")
    # the same question over wider steps: a step of 2 layers moves 0.1-0.3 s, under the noise of a fresh process
    ordered = sorted(rows, key=lambda r: r["layers"])
    growth = []
    for t in tools:
        ok = len(ordered) > 2 and all(r["seconds"].get(t) is not None for r in (ordered[0], ordered[-2], ordered[-1]))
        if ok:
            a, b, c = ordered[0], ordered[-2], ordered[-1]
            before = (b["seconds"][t] - a["seconds"][t]) / (b["layers"] - a["layers"])
            last = (c["seconds"][t] - b["seconds"][t]) / (c["layers"] - b["layers"])
        growth += [f"{100 * (last / before - 1):+.0f}%" if ok and before > 0 else "-", ""]
    if len(ordered) > 2:
        lines.append(f"| **s per layer {ordered[-2]['layers']} -> {ordered[-1]['layers']} against "
                     f"{ordered[0]['layers']} -> {ordered[-2]['layers']}** | | | " + " | ".join(growth) + " |")
    return "\n".join(lines)


def large_table(rows: list[dict]) -> str:
    """One line per model and tool: fused, seconds, peak MB, peak / weights, time / floor."""
    lines = ["| model | weights MB | sites | tool | fused | seconds | peak MB | peak / weights | time / floor | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w, floor = r["weights_mb"], r["seconds"].get("floor")
        for t in TOOLS:
            if t not in r["peak_mb"]:
                continue
            s, pk = r["seconds"].get(t), r["peak_mb"].get(t)
            note = r["errors"].get(t, "")
            how = r["details"].get(t, {}).get("verification", {})
            if how.get("slices"):
                note = (note + "; " if note else "") + f"verified in {how['slices']} slices of layers"
            lines.append(f"| {r['model']} | {w:.0f} | {r['sites']} | {NAMES[t]} | "
                         f"{r['fused'].get(t, '-') if t != 'floor' else '-'} | {fmt_s(s)} | {pk:.0f} | {pk / w:.2f}x | "
                         f"{f'{s / floor:.2f}x' if s is not None and floor else '-'} | {note} |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> str:
    """Issue 11's targets for each large model: met, or by how much they are missed."""
    out = []
    for r in rows:
        s, p, w = r["seconds"], r["peak_mb"], r["weights_mb"]
        checks = [("peak with verification <= 1.5x the weights", p.get("trtattn"), 1.5 * w, "MB"),
                  ("peak without verification <= 0.5x the weights", p.get("trtattn_noverify"), 0.5 * w, "MB"),
                  ("time with verification <= 3x the floor", s.get("trtattn"),
                   3 * s["floor"] if s.get("floor") else None, "s"),
                  ("no verification faster than the fastest peer", s.get("trtattn_noverify"), fastest_peer(r), "s")]
        for what, got, limit, unit in checks:
            if got is None or limit is None:
                out.append(f"- {r['model']}: {what}: not measured")
            elif got <= limit:
                out.append(f"- {r['model']}: {what}: met ({got:.1f} {unit} against {limit:.1f})")
            else:
                out.append(f"- {r['model']}: {what}: MISSED by {100 * (got / limit - 1):.0f}% ({got:.1f} {unit} "
                           f"against {limit:.1f})")
    return "\n".join(out)


def slow_rows(rows: list[dict]) -> list[str]:
    """Rows where trtattn is slower than the fastest peer or takes more than 3x the load+save floor."""
    out = []
    for r in rows:
        s = r["seconds"]
        t, nv, floor, peer = s.get("trtattn"), s.get("trtattn_noverify"), s.get("floor"), fastest_peer(r)
        why = []
        if nv is not None and peer is not None and nv > peer:
            why.append(f"no-verify {nv:.2f}s > fastest peer {peer:.2f}s")
        if t is not None and peer is not None and t > peer:
            why.append(f"verified {t:.2f}s > fastest peer {peer:.2f}s")
        if t is not None and floor and t > 3 * floor:
            why.append(f"verified {t:.2f}s = {t / floor:.0f}x floor")
        if why:
            out.append(f"{r['model']}/{r['exporter']}: " + "; ".join(why))
    return out


def slow_summary(rows: list[dict]) -> str:
    """One line per kind of slowness, with the worst cases (the coverage table has every number)."""
    n = len(rows)
    nv_slower = [r for r in rows if ratio(r, "trtattn_noverify") > 1]
    v_slower = [r for r in rows if ratio(r, "trtattn") > 1]
    over_floor = [r for r in rows if r["seconds"].get("trtattn") and r["seconds"].get("floor")
                  and r["seconds"]["trtattn"] > 3 * r["seconds"]["floor"]]
    worst = sorted(nv_slower, key=lambda r: -ratio(r, "trtattn_noverify"))[:3]
    return "\n".join([
        f"- trtattn without verification is slower than the fastest peer on {len(nv_slower)} of {n} rows"
        + (" (worst: " + ", ".join(f"{r['model']}/{r['exporter']} {ratio(r, 'trtattn_noverify'):.1f}x" for r in worst)
           + ")" if worst else ""),
        f"- with verification: slower than the fastest peer on {len(v_slower)} of {n} rows",
        f"- more than 3x the load+save floor on {len(over_floor)} of {n} rows (the floor is milliseconds for the "
        "small zoo models)"])


def profile_top(pf: Path, n: int = 15) -> list[str]:
    """The trtattn functions with the most cumulative time in a cProfile dump."""
    import pstats

    try:
        st = pstats.Stats(str(pf)).stats
    except (OSError, TypeError, EOFError):
        return []
    rows = sorted(((v[3], k) for k, v in st.items() if "/trtattn/" in k[0]), reverse=True)[:n]
    return [f"{t:7.2f}s {k[0].split('/trtattn/')[-1]}:{k[1]} {k[2]}" for t, k in rows]
