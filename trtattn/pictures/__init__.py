"""The HTML report: pictures of every site as exported and of what replaced it, in one self-contained file
(`--report-html` on fuse, normalize and build; the notebook repr of a fuse result)."""

from __future__ import annotations

from pathlib import Path

from .draw import graphviz
from .page import ModelEntry, SiteEntry, build_entry, fuse_entry, normalize_entry, render


def write_html(path: str | Path, models: list[ModelEntry], title: str = "trtattn report", protect=()) -> Path:
    """Write the page atomically; an existing file only where the caller allowed it (refuse_overwrite)."""
    from ..graph.io import atomic_write, refuse_overwrite

    refuse_overwrite(path, protect)
    atomic_write(path, render(models, title).encode())
    return Path(path)


__all__ = ["ModelEntry", "SiteEntry", "build_entry", "fuse_entry", "normalize_entry", "render", "write_html",
           "graphviz"]
