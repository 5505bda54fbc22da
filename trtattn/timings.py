"""Where a command's time and memory go, phase by phase (`--timings`).

A command opens a `Recorder` for its whole run; the pipeline marks its phases with `phase("verify")`.
Outside a recorder a phase costs one context-variable read, so the marks stay in the code for every run
and only a run that asked for timings pays for the measuring. ONNX Runtime sessions are counted per phase
(`session_made`, called where sessions are opened): a phase that opens more sessions than the models it
runs is where a session could be reused.

Memory is the peak resident set size within each phase. Linux keeps one high-water mark per process, so a
recorder resets it at each phase's start, after folding the mark so far into every phase still open: an
outer phase's peak is then the largest of the readings taken inside it. Only a recorder resets the mark,
so a run without `--timings` leaves it to whoever measures the whole process (the benchmarks).

A leaf: it imports nothing of trtattn's but host_memory, which imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from . import host_memory as memory


@dataclass
class Phase:
    """One phase's totals: a name may be entered several times (verify per retry), its figures add up."""

    name: str
    seconds: float = 0.0
    calls: int = 0
    sessions: int = 0  # ONNX Runtime sessions opened inside it
    peak_bytes: int = 0  # peak resident set size while it ran (0 where the kernel does not tell)


@dataclass
class Timings:
    """A run's phases in the order first entered, and its wall time from the recorder's start."""

    phases: list[Phase] = field(default_factory=list)
    total_seconds: float = 0.0
    sessions: int = 0

    def row(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_json(self) -> dict:
        return {"total_seconds": round(self.total_seconds, 4), "sessions": self.sessions,
                "phases": [{"name": p.name, "seconds": round(p.seconds, 4), "calls": p.calls, "sessions": p.sessions,
                            "peak_mb": round(p.peak_bytes / 2**20, 1)} for p in self.phases]}

    def table(self) -> str:
        """The phases as a text table, with what no phase accounts for as its last row."""
        rows = [(p.name, f"{p.seconds:.3f}", str(p.calls), str(p.sessions), f"{p.peak_bytes / 2**20:.0f}")
                for p in self.phases]
        outer = sum(p.seconds for p in self.phases if not _nested(p.name))
        rows.append(("(other)", f"{max(self.total_seconds - outer, 0.0):.3f}", "", "", ""))
        rows.append(("total", f"{self.total_seconds:.3f}", "", str(self.sessions), ""))
        head = ("phase", "seconds", "calls", "sessions", "peak MB")
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                 for r in [head, *rows]]
        return "\n".join(lines)


def _nested(name: str) -> bool:
    """A phase recorded inside another carries its parent's name before a slash ("verify/session")."""
    return "/" in name


class Recorder:
    def __init__(self) -> None:
        self.timings = Timings()
        self._start = time.perf_counter()
        self._open: list[Phase] = []

    def _fold_peak(self) -> None:
        peak = memory.peak_rss() or 0
        for p in self._open:
            p.peak_bytes = max(p.peak_bytes, peak)

    @contextlib.contextmanager
    def phase(self, name: str):
        full = "/".join([*(p.name for p in self._open[-1:]), name]) if self._open else name
        row = self.timings.row(full)
        if row is None:
            row = Phase(full)
            self.timings.phases.append(row)
        self._fold_peak()
        memory.reset_peak_rss()
        self._open.append(row)
        start = time.perf_counter()
        try:
            yield row
        finally:
            row.seconds += time.perf_counter() - start
            row.calls += 1
            self._fold_peak()
            self._open.pop()

    def session(self) -> None:
        self.timings.sessions += 1
        if self._open:
            self._open[-1].sessions += 1

    def finish(self) -> Timings:
        self.timings.total_seconds = time.perf_counter() - self._start
        return self.timings


P = ParamSpec("P")
R = TypeVar("R")
_CURRENT: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("trtattn_timings", default=None)


@contextlib.contextmanager
def recording():
    """Record the phases of what runs inside; yields the Recorder, whose `timings` are complete on exit."""
    recorder = Recorder()
    token = _CURRENT.set(recorder)
    try:
        yield recorder
    finally:
        recorder.finish()
        _CURRENT.reset(token)


@contextlib.contextmanager
def phase(name: str):
    """Mark a phase of the pipeline; nothing is measured unless a recording is open."""
    recorder = _CURRENT.get()
    if recorder is None:
        yield None
        return
    with recorder.phase(name) as row:
        yield row


def session_made() -> None:
    """Count one ONNX Runtime session opened (in the innermost open phase)."""
    recorder = _CURRENT.get()
    if recorder is not None:
        recorder.session()


def timed(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function whose every call is phase `name` (a stage of the pipeline: read, verify, ...)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def timed_call(*args: P.args, **kwargs: P.kwargs) -> R:
            with phase(name):
                return fn(*args, **kwargs)

        return timed_call

    return wrap
