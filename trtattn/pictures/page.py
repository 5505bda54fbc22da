"""One self-contained HTML page for a run: per model a summary picture, per site the matched subgraph as
exported (roles annotated) beside what replaced it, or the node that stopped the match with the reason.
No network: styles, script and every picture (inline SVG) are in the file."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import onnx

from .. import report as text_report
from ..match import subgraphs
from ..site import SiteStatus
from . import draw
from .subgraph import Region, failed_region, replaced_region, site_region

STATUS_COLOURS = {"fused": "#198754", "rewritten": "#198754", "kept": "#0d6efd", "not fused": "#dc3545",
                  "not attention": "#6c757d"}


@dataclass
class SiteEntry:
    name: str
    status: str
    ok: bool
    reason: str = ""
    facts: list[tuple[str, str]] = field(default_factory=list)
    before: Region | None = None  # the site as exported (or around the node that stopped the match)
    after: Region | None = None  # what replaced it
    error: float | None = None
    bound: float | None = None


@dataclass
class ModelEntry:
    title: str
    sites: list[SiteEntry]
    verification: str = ""
    work: dict[str, float] = field(default_factory=dict)  # build: share of matmul work per dtype
    not_attention: list[tuple[str, str]] = field(default_factory=list)  # softmaxes left alone, with why


def _graph_of(model: onnx.ModelProto, path) -> onnx.GraphProto | None:
    try:
        return subgraphs.find_proto(model.graph, path) if path else model.graph
    except KeyError:
        return None


def fuse_entry(title: str, original: onnx.ModelProto, result) -> ModelEntry:
    """A fuse result (rewrite.fuse.FuseResult) as a page section: the fused model is what replaced each site."""
    bounds = result.verification.bounds or {}
    atol = result.verification.atol
    entries = []
    for r in result.reports:
        site, status = r.site, r.status.value
        graph = _graph_of(original, site.graph)
        fused = r.status == SiteStatus.FUSED
        facts = [("kind", site.kind.value), ("heads q/kv", text_report.heads_words(site)),
                 ("head size", _fmt(site.head_size)), ("scale", _fmt(site.softmax_scale)),
                 ("mask", text_report.mask_words(r)), ("cache", site.cache.value),
                 ("rope", site.rope.kind.value if site.rope else "none"), ("source", site.source)]
        before = None
        if graph is not None:
            before = site_region(graph, site) if fused and site.output else failed_region(graph, site.softmax, r.reason)
        after = None
        if fused and result.changed:
            new_graph = _graph_of(result.model, site.graph)
            after = replaced_region(new_graph, r.attention_node) if new_graph is not None else None
        bound = max(bounds.get(site.output, atol or 0.0) or 0.0, r.tolerance or 0.0) or None
        entries.append(SiteEntry(site.name, status, fused, r.reason, facts, before, after, r.max_abs_err, bound))
    return ModelEntry(title, entries, text_report.summary_line(result.reports, result.ignored),
                      not_attention=[(i.name, i.reason) for i in result.ignored])


def normalize_entry(title: str, original: onnx.ModelProto, result) -> ModelEntry:
    """A normalize result: each site as exported beside the same region of the normalised model."""
    entries = []
    for s in result.sites:
        site, verdict = s.site, s.after
        ok = not s.status.failed
        graph, new_graph = _graph_of(original, site.graph), _graph_of(result.model, site.graph)
        before = site_region(graph, site) if graph is not None and site.output else None
        after = site_region(new_graph, site) if new_graph is not None and site.output and ok else None
        facts = [("heads q/kv", f"{site.q_heads}/{site.kv_heads}"), ("head size", _fmt(site.head_size)),
                 ("scale", _fmt(site.softmax_scale)), ("scale was", site.scale_placement.value),
                 ("scale to", s.scale_to), ("mask form", s.mask_form),
                 ("implicit fusion", _fmt(verdict.implicit if verdict else None)),
                 ("IAttention", _fmt(verdict.iattention if verdict else None))]
        why = "; ".join(s.after_reasons())
        status = s.status.value
        entries.append(SiteEntry(site.name, status, ok, why if not ok else (why or ""), facts, before, after,
                                 s.max_abs_err, None))
    return ModelEntry(title, entries, f"{len(entries)} attention sites, "
                      f"{sum(e.status == 'rewritten' for e in entries)} rewritten",
                      not_attention=[(i.name, i.reason) for i in getattr(result, "ignored", [])])


def build_entry(title: str, prepared) -> ModelEntry:
    """A prepared build: the fuse step's sites, and the matmul work per dtype of the engine's form."""
    entry = fuse_entry(title, prepared.model, prepared.fused)
    entry.work = dict(getattr(prepared.plan, "precision_table", {}) or {})
    return entry


def _fmt(v) -> str:
    return text_report._fmt(v)


# ---------------------------------------------------------------- the page
STYLE = """
body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#212529;max-width:1400px}
h1{font-size:22px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
section.site{border:1px solid #ddd;border-radius:6px;padding:10px 14px;margin:14px 0}
section.site h3{font-size:15px;margin:0 0 6px 0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:12px;margin-left:8px}
.facts{font-size:12px;border-collapse:collapse;margin:6px 0} .facts td{padding:1px 10px 1px 0}
.pictures{display:flex;gap:18px;flex-wrap:wrap;align-items:flex-start}
.picture{overflow:auto;max-width:100%} .picture h4{font-size:12px;color:#555;margin:4px 0}
.picture svg{max-width:100%;height:auto}
.reason{background:#fff3cd;border-left:4px solid #dc3545;padding:6px 10px;font-size:13px}
.summary{display:flex;gap:24px;flex-wrap:wrap}
"""

# Run by the browser: marks every site whose pictures have a laid-out size, so a headless browser's DOM says
# which sites were drawn (tests read it) and a reader sees at a glance if one was not.
SCRIPT = """
(function(){var n=0;document.querySelectorAll('section.site').forEach(function(s){
var svgs=s.querySelectorAll('.picture svg');var ok=svgs.length>0;svgs.forEach(function(g){var b=g.getBBox();
if(!(b.width>0&&b.height>0))ok=false;});s.setAttribute('data-drawn',ok?'yes':'no');if(ok)n++;});
document.body.setAttribute('data-sites-drawn',String(n));})();
"""


def _summary_svgs(entry: ModelEntry) -> str:
    statuses: dict[str, int] = {}
    for s in entry.sites:
        statuses[s.status] = statuses.get(s.status, 0) + 1
    if entry.not_attention:
        statuses["not attention"] = len(entry.not_attention)
    charts = [draw.bars("sites by status", [(k, float(v), STATUS_COLOURS.get(k, "#6c757d"))
                                            for k, v in statuses.items()])]
    ratios = [(s.name, s.error / s.bound, "#198754" if s.error <= s.bound else "#dc3545")
              for s in entry.sites if s.error is not None and s.bound]
    if ratios:
        charts.append(draw.bars("max abs error / bound per site (line: the bound)", ratios, limit=1.0, log=True))
    if entry.work:
        charts.append(draw.bars("matmul work by dtype", [(k, 100 * v, "#0d6efd") for k, v in
                                                       sorted(entry.work.items(), key=lambda kv: -kv[1])], unit="%"))
    return "".join(c for c in charts if c)


def _site_html(s: SiteEntry) -> str:
    colour = STATUS_COLOURS.get(s.status, "#6c757d")
    facts = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in s.facts)
    if s.error is not None:
        facts += f"<tr><td>max abs error</td><td>{s.error:.3g}" + (f" (bound {s.bound:.3g})" if s.bound else "") + \
                 "</td></tr>"
    pictures = []
    for heading, region in (("as exported" if s.ok else "where the match stopped (highlighted)", s.before),
                            ("what replaced it", s.after)):
        svg = draw.region_svg(region)
        if svg:
            pictures.append(f'<div class="picture"><h4>{heading}</h4>{svg}</div>')
    reason = f'<div class="reason">{html.escape(s.reason)}</div>' if s.reason and not s.ok else ""
    return (f'<section class="site" data-site="{html.escape(s.name)}" data-status="{html.escape(s.status)}">'
            f'<h3>{html.escape(s.name)}<span class="badge" style="background:{colour}">{html.escape(s.status)}</span>'
            f'</h3>{reason}<table class="facts">{facts}</table><div class="pictures">{"".join(pictures)}</div></section>')


def render(models: list[ModelEntry], title: str = "trtattn report") -> str:
    """The whole page as one string."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for m in models:
        body.append(f'<h2 data-model="{html.escape(m.title)}">{html.escape(m.title)}</h2>')
        if m.verification:
            body.append(f"<p>{html.escape(m.verification)}</p>")
        body.append(f'<div class="summary">{_summary_svgs(m)}</div>')
        body += [_site_html(s) for s in m.sites]
        if m.not_attention:
            items = "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(r)}</li>" for n, r in m.not_attention)
            body.append(f"<details><summary>softmaxes that are not attention ({len(m.not_attention)})</summary>"
                        f"<ul>{items}</ul></details>")
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}<script>{SCRIPT}</script></body></html>")
