"""Export folders as one unit: every ONNX model of a folder (Optimum's model.onnx, or encoder_model.onnx,
decoder_model.onnx, decoder_with_past_model.onnx, decoder_model_merged.onnx beside config.json,
generation_config.json and the tokenizer files) fused or normalized with the same verification as one
file, every other file copied unchanged. An ONNX Runtime GenAI folder's genai_config.json is written to match the models written
(trtattn.folder_genai: a shared past/present buffer turned off where the fused decoder concatenates), its
changes in the folder's notes.

The output folder is written under a scratch name beside it and renamed into place at the end, so a
failed run leaves nothing half written; the input folder is only read. A model's external data files
belong to it: a rewritten model writes its own (MODEL.onnx.data), an unchanged one is copied with them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import folder_genai
from .errors import TrtattnError
from .graph import external, validate
from .graph import io as onnxio
from .report import short_verdict
from .site import SiteOutcome
from .verification import Verification

MODES = ("fuse", "normalize")
NOT_MODELS = ("copied", "adapted")  # the actions of a folder's other files


@dataclass
class FileResult:
    """One file of the folder: a model (with its sites) or a plain file copied."""
    path: str  # relative to the folder
    action: str  # fused | normalized | unchanged (a model with nothing to do) | copied | adapted (a config) | not written
    sites: list[SiteOutcome] = field(default_factory=list)  # the model's sites, as `fuse`/`normalize` report them
    ignored: list[dict] = field(default_factory=list)
    verification: Verification = field(default_factory=Verification.nothing)
    ok: bool = True  # every attention of the model fused (normalized) and verified

    def row(self) -> dict:
        return {"file": self.path, "action": self.action, "sites": len(self.sites),
                "done": sum(r.status.changed for r in self.sites),
                "not_done": sum(r.status.failed for r in self.sites), "ok": self.ok,
                "verification": short_verdict(self.verification)}


@dataclass
class FolderResult:
    source: Path
    output: Path | None  # None when nothing was written
    files: list[FileResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was changed beside the models, and why

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def models(self) -> list[FileResult]:
        return [f for f in self.files if f.action not in NOT_MODELS]

    def site_rows(self) -> list[dict]:
        """One row per site of every model, the file first."""
        return [{"file": f.path, **r.row()} for f in self.models for r in f.sites]

    def report(self) -> dict:
        return {"input": str(self.source), "output": str(self.output) if self.output else None, "ok": self.ok,
                "files": [f.row() for f in self.files], "sites": self.site_rows(),
                "ignored": [{"file": f.path, **i} for f in self.models for i in f.ignored],
                "verification": {f.path: f.verification.to_json() for f in self.models}, "notes": self.notes}


def is_folder(path) -> bool:
    return Path(path).is_dir()


def models_in(folder: Path) -> list[Path]:
    """The ONNX models of a folder (and its subfolders), in a stable order."""
    return sorted(p for p in folder.rglob("*.onnx") if p.is_file())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _data_files(folder: Path, models: list[Path]) -> dict[Path, Path]:
    """External data file -> the model that reads it."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    owned = {}
    for m in models:  # the locations as written (graph.io.load would read small tensors in and forget them)
        model = onnx.load(str(m), load_external_data=False)
        for t in external.all_tensors(model):
            if uses_external_data(t):
                owned[(m.parent / ExternalDataInfo(t).location).resolve()] = m
    return owned


def check_folders(source, output, force: bool) -> tuple[Path, Path]:
    """Before any work: SOURCE is a folder, OUTPUT is neither it nor inside it (nor it inside OUTPUT), and an
    existing OUTPUT only with --force."""
    src, out = Path(source), Path(output)
    if not src.is_dir():
        raise TrtattnError(f"{src}: not a folder")
    rs, ro = src.resolve(), out.resolve()
    if rs == ro or rs in ro.parents or ro in rs.parents:
        raise TrtattnError(f"refusing to write {out}: it is the input folder {src}, inside it or around it")
    if out.exists() and not force:
        raise TrtattnError(f"{out} exists (use --force to replace it)")
    if out.exists() and not out.is_dir():
        raise TrtattnError(f"{out} exists and is not a folder")
    return src, out


def process_folder(source, output, *, mode: str = "fuse", force: bool = False, allow_partial: bool = False,
                   progress=None, **options) -> FolderResult:
    """Fuse (mode="fuse") or normalize (mode="normalize") every ONNX model of the export folder SOURCE into
    OUTPUT, copying every other file unchanged. `options` go to trtattn.fuse / normalize_model (dims, seed,
    atol, ...). When a model has an attention that does not fuse, or fails verification, nothing is written
    (result.output is None) unless allow_partial: then such a model is written with the sites that fused
    and verified, or copied unchanged if its verification failed."""
    if mode not in MODES:
        raise TrtattnError(f"unknown folder mode '{mode}' (one of {', '.join(MODES)})")
    src, out = check_folders(source, output, force)
    models = models_in(src)
    if not models:
        raise TrtattnError(f"{src}: a directory with no ONNX model (*.onnx) in it")
    data = _data_files(src, models)
    result = FolderResult(src, None)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(scratch, 0o777 & ~_umask())  # mkdtemp's 0700 is for the scratch, not the output
    try:
        files = sorted(p for p in src.rglob("*") if p.is_file())
        configs = [p for p in files if folder_genai.is_genai_config(p)]  # after the models they describe
        shared = {d for c in configs for d in folder_genai.shared_decoders(c)} if mode == "fuse" else set()
        for path in progress.track(files, f"{mode} {src.name}", unit="file") if progress is not None else files:
            rel = path.relative_to(src)
            if path in configs:
                continue
            if path.suffix == ".onnx":
                # a decoder GenAI binds one buffer to as past and present: its presents written into it
                given = {**options, "shared_buffer": True} if path in shared else options
                result.files.append(_one_model(path, rel, scratch / rel, data, mode, allow_partial, progress, given))
            elif path.resolve() not in data:
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, scratch / rel)
                result.files.append(FileResult(str(rel), "copied"))
        for path in configs:
            result.files.append(_genai_config(path, src, scratch, result))
        if result.ok or allow_partial:
            if out.exists():
                shutil.rmtree(out)
            os.replace(scratch, out)
            result.output = out
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)
    return result


def _one_model(path: Path, rel: Path, dst: Path, data: dict, mode: str, allow_partial: bool, progress,
               options) -> FileResult:
    model = onnxio.load(path, load_external_data=False)
    note = validate.check_read(model, path)  # as a single model's command reads it
    if progress is not None:  # a heading: the steps inside print their own lines
        progress.note(f"{mode} {rel}:")
        if note:
            progress.note(note)
    result = _transform(model, mode, progress, options)
    sites = result.reports if mode == "fuse" else result.sites
    ignored = [{"name": i.name, "reason": i.reason} for i in result.ignored]
    failed = result.verification.failed
    file = FileResult(str(rel), "", list(sites), ignored, result.verification, ok=result.ok)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not result.changed or (failed and allow_partial):
        _copy_with_data(path, dst, data)
        file.action = "unchanged" if not result.changed else "not written"
    elif result.ok or allow_partial:
        onnxio.save(result.model, dst, protect=(path,), progress=progress)
        file.action = "fused" if mode == "fuse" else "normalized"
    else:
        file.action = "not written"
    return file


def _genai_config(path: Path, src: Path, scratch: Path, result: FolderResult) -> FileResult:
    """genai_config.json written to match the models written beside it (those rewritten named relative to it)."""
    rel = path.relative_to(src)
    here = path.parent.relative_to(src)
    rewritten = {Path(f.path).relative_to(here).as_posix() for f in result.models
                 if f.action in ("fused", "normalized") and Path(f.path).is_relative_to(here)}
    changes = folder_genai.adapt_config(path, scratch / rel, rewritten)
    result.notes += [c.note() for c in changes]
    window = folder_genai.window_note(path, scratch / rel, rewritten)
    result.notes += [window] if window else []
    if not changes:
        shutil.copy2(path, scratch / rel)  # byte for byte, as any other file
    return FileResult(str(rel), "adapted" if changes else "copied")


def _transform(model, mode: str, progress, options):
    if mode == "fuse":
        from .rewrite.fuse import fuse_model

        return fuse_model(model, progress=progress, **options)
    from .rewrite.normalize import normalize_model

    return normalize_model(model, progress=progress, **options)


def _copy_with_data(path: Path, dst: Path, data: dict) -> None:
    """A model the run did not change: the file and its external data files, byte for byte."""
    shutil.copy2(path, dst)
    for file, owner in data.items():
        if owner == path:
            target = dst.parent / file.relative_to(path.parent.resolve())
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, target)


def fuse_folder(source, output, **options) -> FolderResult:
    """Every ONNX model of an export folder fused into the standard ONNX Attention op and verified; every
    other file copied (see process_folder)."""
    return process_folder(source, output, mode="fuse", **options)


def normalize_folder(source, output, **options) -> FolderResult:
    """Every ONNX model of an export folder rewritten to TensorRT's fusion rules, verified (see process_folder)."""
    return process_folder(source, output, mode="normalize", **options)
