"""The inspect report as a table, one row per attention site (its verdict, kernel and the precision it ran in),
then the reasons and a summary line."""

from __future__ import annotations

from ..report import table


def _short(names: list[str], limit: int = 2, width: int = 60) -> str:
    cut = [n if len(n) <= width else n[: width - 3] + "..." for n in names[:limit]]
    more = len(names) - limit
    return ", ".join(cut) + (f" (+{more} more)" if more > 0 else "")


def _proof(row: dict) -> str | None:
    """The kernel, shortened; else what else proved the site fused (the sidecar's decomposable=False)."""
    kernel = row["kernel"]
    if kernel:
        return kernel if len(kernel) <= 48 else kernel[:45] + "..."
    return f"({row['proof']})" if row["proof"] else None


def render_table(report: dict) -> str:
    rows = [{"site": r["site"], "status": r["status"], "kernel": _proof(r),
             "layers": _short(r["layers"]) if r["layers"] else "-"} for r in report["attention"]]
    columns = [("site", "site"), ("status", "fused"), ("kernel", "kernel"), ("layers", "layers")]
    if any(r["precision"] or r["built_for"] for r in report["attention"]):
        columns.insert(2, ("precision", "precision"))
        for row, r in zip(rows, report["attention"]):
            ran = r["precision"] or "?"
            row["precision"] = f"{ran} (built {r['built_for']})" if r.get("precision_problem") else ran
    if any(r["listed_in_sidecar"] for r in report["attention"]):
        columns.insert(2, ("sidecar", "sidecar"))
        for row, r in zip(rows, report["attention"]):
            row["sidecar"] = r["listed_in_sidecar"]
    out = []
    if rows:
        out.append(table(rows, columns))
    for r in report["attention"]:
        if r.get("reason") and r["status"] != "fused":
            out.append(f"  {r['site']}: {r['reason']}")
        if r.get("precision_problem"):
            out.append(f"  {r['site']}: {r['precision_problem']}")
    for s in report["other_softmax"]:
        out.append(f"other softmax (not attention): {s['name']}: {s['reason']}")
    summary = report["summary"]
    if summary["opaque_layers"]:
        out.append(f"opaque layers (no kernel detail): {_short(summary['opaque_layers'], 3)}")
    line = (f"{summary['attention']} attention site(s): {summary['fused']} fused, {summary['not_fused']} not fused"
            + (f", {summary['unproven']} unproven" if summary["unproven"] else "")
            + (f", {len(summary['missing'])} missing" if summary["missing"] else "")
            + (f", {len(summary['wrong_precision'])} not in the precision built for"
               if summary["wrong_precision"] else "")
            + f"; {summary['other_softmax']} other softmax; {summary['layers']} layers "
              f"({summary['verbosity'].replace('_', ' ')}) from {report['format']} {report['source']}")
    out.append(line)
    return "\n".join(out)
