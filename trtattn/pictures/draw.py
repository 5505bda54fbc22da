"""Pictures as inline SVG: a region of a graph laid out by Graphviz, and the small summary charts."""

from __future__ import annotations

import html
import math
import shutil
import subprocess

from ..errors import MissingDependencyError
from .subgraph import Region, node_name

ROLE_COLOURS = {"Q·Kᵀ": "#cfe2ff", "P·V": "#cfe2ff", "softmax": "#ffe69c", "scale": "#d1e7dd",
                "mask": "#f8d7da", "mask / bias": "#f8d7da", "soft-cap": "#e2d9f3", "cache": "#fde2c8",
                "rope": "#d2f4ea", "layout": "#eeeeee", "fused attention": "#a3cfbb"}
HIGHLIGHT = "#dc3545"


def graphviz() -> str:
    """The `dot` program, or one sentence saying how to get it."""
    dot = shutil.which("dot")
    if dot is None:
        raise MissingDependencyError("the HTML report lays out its pictures with Graphviz's `dot`, which is not "
                                     "installed: apt-get install graphviz (or conda install graphviz)")
    return dot


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _q(text: str) -> str:
    return f'"{_esc(text)}"'


def dot_source(region: Region) -> str:
    """The region as a Graphviz digraph: one box per node (op type, role, name), one edge per tensor."""
    graph = region.graph
    names = [node_name(n, i) for i, n in enumerate(graph.node)]
    by_name = {names[i]: n for i, n in enumerate(graph.node)}
    producer = {o: nm for nm in region.nodes for o in by_name[nm].output}
    lines = ["digraph G {", "  graph [rankdir=TB, nodesep=0.25, ranksep=0.3, bgcolor=transparent];",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, fillcolor="#ffffff"];',
             '  edge [fontname="Helvetica", fontsize=8, color="#666666"];']
    for t in region.inputs:
        lines.append(f'  {_q("in:" + t)} [label={_q(_short(t))}, shape=ellipse, fillcolor="#f6f6f6", fontsize=9];')
    for nm in region.nodes:
        node, role = by_name[nm], region.roles.get(nm)
        label = "\\n".join(_esc(p) for p in [node.op_type] + ([f"[{role}]"] if role else []) + [_short(nm)])
        fill = ROLE_COLOURS.get(role or "", "#ffffff")
        extra = f', color="{HIGHLIGHT}", penwidth=3, fontcolor="{HIGHLIGHT}"' if nm in region.highlight else ""
        lines.append(f'  {_q(nm)} [label="{label}", '
                     f'fillcolor="{fill}", tooltip={_q(nm)}, id={_q("node:" + nm)}{extra}];')
    for nm in region.nodes:
        for t in by_name[nm].input:
            if not t:
                continue
            src = producer.get(t)
            if src is not None:
                lines.append(f"  {_q(src)} -> {_q(nm)};")
            elif t in region.inputs:
                lines.append(f"  {_q('in:' + t)} -> {_q(nm)};")
    lines.append("}")
    return "\n".join(lines)


def _short(name: str, width: int = 32) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def region_svg(region: Region | None) -> str:
    """The region drawn by Graphviz, as an <svg> element ('' for no region)."""
    if region is None or not region.nodes:
        return ""
    done = subprocess.run([graphviz(), "-Tsvg"], input=dot_source(region).encode(), capture_output=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"Graphviz failed: {done.stderr.decode(errors='replace').strip()[:300]}")
    text = done.stdout.decode()
    return text[text.index("<svg"):]  # inline: no XML declaration or DOCTYPE


# ---------------------------------------------------------------- summary charts, written directly
def bars(title: str, items: list[tuple[str, float, str]], unit: str = "", limit: float | None = None,
         log: bool = False) -> str:
    """A horizontal bar chart: items are (label, value, colour); `limit` draws a vertical line (a bound)."""
    if not items:
        return ""
    width, left, row = 520, 170, 20
    height = 28 + row * len(items) + 8
    values = [max(v, 1e-12) for _, v, _ in items] + ([limit] if limit else [])

    def x(v: float) -> float:
        if log:
            lo, hi = math.log10(min(values)) - 0.5, math.log10(max(values)) + 0.5
            return left + (width - left - 60) * (math.log10(max(v, 1e-12)) - lo) / max(hi - lo, 1e-9)
        return left + (width - left - 60) * v / max(max(values), 1e-12)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}" class="chart">',
             f'<text x="4" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    for i, (label, value, colour) in enumerate(items):
        y = 28 + i * row
        x0 = left if not log else x(min(values) / 10 ** 0.5)
        parts.append(f'<text x="{left - 6}" y="{y + 13}" font-size="11" text-anchor="end">{html.escape(_short(label, 26))}'
                     "</text>")
        parts.append(f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(x(value) - x0, 1):.1f}" height="{row - 6}" '
                     f'fill="{colour}"><title>{html.escape(label)}: {value:.3g}{unit}</title></rect>')
        parts.append(f'<text x="{max(x(value), x0) + 4:.1f}" y="{y + 13}" font-size="10">{value:.3g}{unit}</text>')
    if limit:
        parts.append(f'<line x1="{x(limit):.1f}" x2="{x(limit):.1f}" y1="24" y2="{height - 4}" stroke="{HIGHLIGHT}" '
                     'stroke-dasharray="4 3"/>')
    parts.append("</svg>")
    return "".join(parts)
