"""Per-site tables and JSON reports, and a small progress printer for long steps."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from .graph.io import atomic_write, refuse_overwrite
from .graph.user_inputs import InputsUsed
from .site import AttentionSite, SiteOutcome, SiteStatus
from .verification import Verification


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Fixed-width text table; columns are (key, header)."""
    cells = [[h for _, h in columns]] + [[_fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


SITE_COLUMNS = [("name", "site"), ("kind", "kind"), ("heads", "heads q/kv"), ("head_size", "head"),
                ("scale", "scale"), ("mask_desc", "mask"), ("cache", "cache"), ("rope", "rope"),
                ("status", "status"), ("detail", "max err / reason")]


class FuseRow(Protocol):
    """fuse's outcome of a site (rewrite/fuse.py's SiteReport) as its table reads it: report.py sits below
    rewrite, so it names the fields it reads rather than importing the class."""

    site: AttentionSite
    status: SiteStatus
    reason: str
    max_abs_err: float | None
    padding: bool
    bias: bool

    @property
    def one_key(self) -> bool: ...

    def row(self) -> dict: ...


def heads_words(site: AttentionSite) -> str:
    return f"{_fmt(site.q_heads)}/{_fmt(site.kv_heads)}"


def mask_words(report: FuseRow) -> str:
    """The site's mask in the table's words: its kind, or causal with its window, and padding and bias."""
    s = report.site
    mask = s.mask.value
    if s.causal.value != "none":
        mask = f"causal({s.causal.value})" + (f" window {s.window}" if s.window else "")
        if report.padding:
            mask += "+padding"
        if report.bias:
            mask += "+bias"
    elif report.padding and mask != "none":
        mask = f"{mask}(padding" + ("+bias)" if report.bias else ")")
    return mask


def site_rows(reports: Sequence[FuseRow]) -> list[dict]:
    """fuse's site rows (SiteReport.row(), the cells the table writes) with the table's own columns: the heads and
    the mask in words, the error or the reason."""
    out = []
    for report in reports:
        detail = report.reason if report.status != SiteStatus.FUSED else \
            _fmt(report.max_abs_err) + (" (one key: unproven)" if report.one_key else "")
        out.append({**report.row(), "heads": heads_words(report.site), "mask_desc": mask_words(report),
                    "detail": detail})
    return out


def site_table(reports: Sequence[FuseRow]) -> str:
    return table(site_rows(reports), SITE_COLUMNS)


def counts(reports: Sequence[SiteOutcome], ignored=()) -> dict:
    """Attention-like softmaxes (and attention ops already in the model), fused and not, and the softmaxes
    that are not attention."""
    fused = sum(r.status == SiteStatus.FUSED for r in reports)
    ops = sum(r.site.source.is_op for r in reports)
    # a site merged from single-head ones (match/heads_merge.py) holds one softmax per head
    softmaxes = sum(len(r.site.merged) or 1 for r in reports if not r.site.source.is_op)
    return {"sites": len(reports), "softmaxes": softmaxes, "attention_ops": ops, "fused": fused,
            "not_fused": len(reports) - fused, "not_attention": len(ignored)}


def summary_line(reports: Sequence[SiteOutcome], ignored=()) -> str:
    """'3 attention-like softmaxes: 2 fused, 1 not fused' (+ attention ops, + softmaxes that are not attention)."""
    c = counts(reports, ignored)
    if not reports:
        head = "no attention found"
    else:
        what = f"{c['softmaxes']} attention-like softmax{'es' if c['softmaxes'] != 1 else ''}"
        if c["softmaxes"] != c["sites"] - c["attention_ops"]:
            what += f" in {c['sites'] - c['attention_ops']} sites (heads merged)"
        if c["attention_ops"]:
            what += f" and {c['attention_ops']} attention op{'s' if c['attention_ops'] != 1 else ''}"
        head = f"{what}: {c['fused']} fused, {c['not_fused']} not fused"
    if c["not_attention"]:
        head += f" ({c['not_attention']} other softmax{'es' if c['not_attention'] != 1 else ''}: not attention)"
    return head


# ---------------------------------------------------------------- a verification in words (the one writer of it)
def verdict(v: Verification) -> str:
    """A verification in one line, as the commands print it."""
    if v.note:
        return v.note
    if v.error:  # a check that could not run its inputs (routes/trt_ops: a kernel's refusal)
        return f"FAILED: {v.error}"
    if v.passed is None:
        return "not run"
    err = v.max_abs_err
    how = f", run in {v.slices} slices of layers" if v.slices else ""
    used = f"; {inputs_phrase(v.inputs)}" if v.inputs else ""
    used += f"; {rows_phrase(v.lengths)}" if v.lengths else ""
    used += f"; at {v.tolerance_why}" if v.tolerance_why else ""
    used += f"; {v.run_on}" if v.run_on else ""
    one_key = f"; verified at one key only, which proves nothing: {', '.join(v.one_key)}" if v.one_key else ""
    return ("passed" if v.passed else "FAILED") + (f" (max abs error {err:.3g} over {v.iterations} inputs{how}{used})"
                                                   if err is not None else "") + one_key


def short_verdict(v: Verification) -> str:
    """A verification in a table cell: 'passed (0.00123)', 'FAILED (...)', the note, or '-' for none."""
    if v.empty:
        return "-"
    if v.passed is None:
        return v.note or "not run"
    err = v.max_abs_err
    return ("passed" if v.passed else "FAILED") + (f" ({err:.3g})" if err is not None else "")


def rows_phrase(lengths: list[dict]) -> str:
    """A ragged form's check: the per-row lengths of its first input set ('rows: new [3, 1], ...')."""
    return "rows: " + ", ".join(f"{name} {rows}" for name, rows in lengths[0].items())


def inputs_phrase(inputs: InputsUsed) -> str:
    """Which inputs a verification ran on: 'inputs from FILE', or 'searched inputs (name: domain, ...)', and
    notes (random ops)."""
    if inputs.source == "file":
        text = f"inputs from {inputs.path}"
    else:
        text = "searched inputs (" + ", ".join(f"{k}: {d}" for k, d in inputs.domains.items()) + ")"
    return "; ".join([text, *inputs.notes])


def _jsonable(value):
    """Typed records as their JSON (Verification.to_json), for json.dumps."""
    to_json = getattr(value, "to_json", None)
    if to_json is not None:
        return to_json()
    return str(value)


def write_json(data: dict, path: str | Path, protect=()) -> None:
    refuse_overwrite(path, protect)
    atomic_write(path, json.dumps(data, indent=2, default=_jsonable) + "\n")


class Progress:
    """Where a long run is, on stderr. On a terminal: tqdm bars with counts and an ETA for counted work
    (`track`; `count` inside a step: the dims search, mask probes, verification slices, tensors written) and a
    live timer for each step; elsewhere (a log, a pipe, CI): plain lines, '[trtattn] step ... done (1.2s)'.
    `enabled=False` (--quiet) prints nothing."""

    def __init__(self, enabled: bool = True, stream=None, bars: bool | None = None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.bars = enabled and (bars if bars is not None else bool(isatty and isatty()))
        self.open_step: _Step | None = None  # a plain step line waiting for its ' done'

    def _end_open_line(self) -> None:
        if self.open_step is not None:  # something prints inside a step: its line ends here, 'done' comes later
            print(file=self.stream)
            self.open_step.interrupted, self.open_step = True, None

    def _plain(self, text: str) -> None:
        self._end_open_line()
        print(text, file=self.stream, flush=True)

    def step(self, text: str):
        return _Step(self, text)

    def note(self, text: str) -> None:
        """One line, above any bar."""
        if not self.enabled:
            return
        if self.bars:
            from tqdm import tqdm

            tqdm.write(f"[trtattn] {text}", file=self.stream)
        else:
            self._plain(f"[trtattn] {text}")

    def track(self, items, text: str, total: int | None = None, unit: str = "it"):
        """Iterate `items`, showing how many of `total` are done (and an ETA on a terminal)."""
        if total is None and hasattr(items, "__len__"):
            total = len(items)
        if not self.enabled:
            yield from items
            return
        if self.bars:
            from tqdm import tqdm

            yield from tqdm(items, desc=f"[trtattn] {text}", total=total, unit=unit, file=self.stream, leave=False,
                            dynamic_ncols=True)
            self.note(f"{text}: {total if total is not None else 'all'} {unit} done")
            return
        t, n = time.perf_counter(), 0
        self._plain(f"[trtattn] {text} ({total} {unit}) ..." if total else f"[trtattn] {text} ...")
        for item in items:
            n += 1
            yield item
        self._plain(f"[trtattn] {text}: {n} done ({time.perf_counter() - t:.1f}s)")

    def count(self, items, text: str, total: int | None = None, unit: str = "it"):
        """Iterate `items` inside a step: a counted bar with an ETA on a terminal; nothing elsewhere (the
        step's own line says what runs, so plain logs stay as they were)."""
        if not self.bars:
            yield from items
            return
        from tqdm import tqdm

        yield from tqdm(items, desc=f"[trtattn] {text}", total=total if total is not None else
                        (len(items) if hasattr(items, "__len__") else None), unit=unit, file=self.stream, leave=False,
                        dynamic_ncols=True)


class _Step:
    def __init__(self, progress: Progress, text: str):
        self.p, self.text, self.bar, self.interrupted = progress, text, None, False

    def __enter__(self):
        self.t = time.perf_counter()
        if self.p.bars:
            from tqdm import tqdm

            self.bar = tqdm(total=None, desc=f"[trtattn] {self.text}", bar_format="{desc} {elapsed}", file=self.p.stream,
                            leave=False)
        elif self.p.enabled:
            self.p._end_open_line()
            print(f"[trtattn] {self.text} ...", file=self.p.stream, end="", flush=True)
            self.p.open_step = self
        return self

    def __exit__(self, exc_type, exc, tb):
        status = "done" if exc_type is None else "failed"
        if self.bar is not None:
            self.bar.close()
            self.p.note(f"{self.text} {status} ({time.perf_counter() - self.t:.1f}s)")
        elif self.p.enabled:
            took = f"{status} ({time.perf_counter() - self.t:.1f}s)"
            if self.interrupted:
                self.p._plain(f"[trtattn] {self.text} {took}")
            else:
                print(f" {took}", file=self.p.stream, flush=True)
                self.p.open_step = None
        return False
