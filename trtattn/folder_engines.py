"""`trtattn build DIR`: one engine per part of an export folder, and a pipeline sidecar (pipeline.json).

    encoder_model.onnx             the padded form
    decoder_model.onnx             the padded form (the first decoder step: no past)
    decoder_with_past_model.onnx   the kv-cache form; where that form cannot take it (T5's relative position
                                   bias over the cache), the padded form with its past growing, said why
    model.onnx (decoder-only)      the kv-cache form
    decoder_model_merged.onnx      its two branches (graph/branches.py): use_cache_branch=False as the
                                   first step (padded), True as the kv-cache form

Each part goes through build.prepare (fused, form derived and verified on ONNX Runtime) and, with
TensorRT, build.build. pipeline.json names the parts, the file each came from, their form, their I/O
contract (inputs, profiles) and the generation settings from generation_config.json; the folder's
config, generation config and tokenizer files are copied beside it, so `run` finds them. A part that
cannot be prepared is listed with why (and the command exits 1); nothing in DIR is modified.

`--inputs INPUTS_DIR` verifies each part on its own inputs: INPUTS_DIR/ROLE.npz or ROLE.json (Polygraphy's
inputs JSON), e.g. encoder.npz, decoder_with_past.json; a part without a file is verified on generated
inputs, as its record says; a file naming no part, or a single file, is refused.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .contract import PIPELINE_JSON
from .errors import TrtattnError
from .graph import io as onnxio
from .graph import validate
from .graph.branches import branch_inputs, take_branch
from .runtime.pipeline import find_parts, generation_settings

if TYPE_CHECKING:  # imported where it runs (prepare_folder): listing a folder's parts needs no route
    from .routes.prepare.pipeline import Prepared

COPIED = ("config.json", "generation_config.json", "genai_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json")


@dataclass
class PartPlan:
    role: str  # encoder | decoder | decoder_with_past
    source: Path
    form: str
    branch: str | None = None  # "use_cache_branch=True" for a part taken from a merged decoder
    prepared: Prepared | None = None
    error: str | None = None
    note: str | None = None  # why the part is not in the form first planned for it

    def entry(self, engine: str | None) -> dict:
        row: dict[str, object] = {"source": self.source.name, "form": self.form, "branch": self.branch, "file": engine}
        if self.prepared is not None:
            plan = self.prepared.plan
            row.update(inputs=plan.inputs_json(), profiles=plan.profiles, sites=len(plan.attentions),
                       onnx=f"{self.role}.{self.form}.onnx")
        if self.error:
            row["error"] = self.error
        if self.note:
            row["note"] = self.note
        return row


@dataclass
class FolderBuild:
    source: Path
    out_dir: Path
    kind: str
    parts: list[PartPlan] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.error is None for p in self.parts)


def part_plans(folder: Path) -> list[PartPlan]:
    """What to build from each part of the folder, and in which form."""
    parts = find_parts(folder)
    if "decoder" not in parts:
        raise TrtattnError(f"{folder}: no decoder (expected model.onnx, decoder_model.onnx or decoder_model_merged.onnx, "
                           "as Optimum writes them)")
    plans = []
    if "encoder" in parts:
        plans.append(PartPlan("encoder", parts["encoder"], "padded"))
    decoder = parts["decoder"]
    if decoder.stem.startswith("decoder_model_merged"):
        plans.append(PartPlan("decoder", decoder, "padded", branch="use_cache_branch=False"))
        plans.append(PartPlan("decoder_with_past", decoder, "kv-cache", branch="use_cache_branch=True"))
    elif "decoder_with_past" in parts:
        plans.append(PartPlan("decoder", decoder, "padded"))
        plans.append(PartPlan("decoder_with_past", parts["decoder_with_past"], "kv-cache"))
    else:  # decoder-only with past (Optimum's model.onnx): the kv-cache form prefills and decodes
        plans.append(PartPlan("decoder", decoder, "kv-cache"))
    return plans


def _load(part: PartPlan, progress=None):
    """The part's model as a single model's command reads it (validate.check_read: what ONNX Runtime repairs is
    repaired, with a note), its weights left on disk; the merged decoder's branch taken."""
    model = onnxio.load(part.source, load_external_data=False)
    note = validate.check_read(model, part.source)
    if note and progress is not None:
        progress.note(note)
    if part.branch is None:
        return model
    name, value = part.branch.split("=")
    if name not in branch_inputs(model):
        raise TrtattnError(f"{part.source}: no boolean input '{name}' deciding an If")
    return take_branch(model, name, value == "True", drop_empty=True)


def part_inputs(inputs, plans: list[PartPlan]) -> dict[str, Path]:
    """Part role -> its inputs file in the folder `inputs` (module doc); {} without one."""
    if inputs is None:
        return {}
    path, roles = Path(inputs), [p.role for p in plans]
    wanted = ", ".join(f"{r}.npz" for r in dict.fromkeys(roles))
    if not path.is_dir():
        raise TrtattnError(f"--inputs {path}: with an export folder, give a folder of one inputs file per part "
                           f"({wanted}, or .json)")
    files = {f.stem: f for f in sorted(path.iterdir()) if f.suffix in (".npz", ".json")}
    unknown = [f.name for stem, f in files.items() if stem not in roles]
    if unknown or not files:
        raise TrtattnError(f"--inputs {path}: " + (f"{', '.join(unknown)} names no part of this folder" if unknown
                                                    else "holds no inputs file") + f" (its parts: {wanted})")
    return files


def prepare_folder(source, out_dir, *, precision: str | None = None, dims=None, force: bool = False, progress=None,
                   inputs=None, **options) -> FolderBuild:
    """build.prepare for every part, each verified on its file in the folder `inputs` (part_inputs) if it has
    one; the verified forms and plans written to OUT_DIR with pipeline.json."""
    from .graph.user_inputs import GivenInputs
    from .routes.prepare import prepare

    src, out = Path(source), Path(out_dir)
    if not src.is_dir():
        raise TrtattnError(f"{src}: not a folder")
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise TrtattnError(f"refusing to write {out}: it is the input folder {src} or inside it")
    if (out / PIPELINE_JSON).exists() and not force:
        raise TrtattnError(f"{out / PIPELINE_JSON} exists (use --force to replace it)")
    plans = part_plans(src)
    files = part_inputs(inputs, plans)
    result = FolderBuild(src, out, "encoder-decoder" if plans[0].role == "encoder" else "decoder-only", plans)
    out.mkdir(parents=True, exist_ok=True)
    for part in progress.track(plans, "preparing the parts", unit="part") if progress is not None else plans:
        label = f"{part.role} ({part.source.name}{', ' + part.branch if part.branch else ''}, {part.form})"
        if progress is not None:  # a heading: prepare's steps print their own lines
            progress.note(f"preparing {label}:")
        settings = dict(precision=precision, dims=dims, progress=progress, source=str(part.source), **options)
        try:
            model = _load(part, progress)
            settings["inputs"] = GivenInputs.load(files.get(part.role), model)
            part.prepared = prepare(model, name=part.role, form=part.form, **settings)
        except TrtattnError as e:
            part.error = str(e)
        if part.error and part.role == "decoder_with_past" and part.form == "kv-cache":
            # a decoder step the kv-cache form cannot take (T5's relative position bias over the cache) still
            # generates as the padded form, its past growing each step: said in the table and pipeline.json
            try:
                part.prepared = prepare(_load(part), name=part.role, form="padded", **settings)
            except TrtattnError:
                continue  # the kv-cache form's reason stays the one listed
            part.form, part.note, part.error = "padded", f"padded form (a growing cache), not kv-cache: {part.error}", None
        if part.error or part.prepared is None:
            continue
        onnxio.save(part.prepared.form_model, out / f"{part.role}.{part.form}.onnx", protect=(part.source,),
                    progress=progress)
        onnxio.atomic_write(out / f"{part.role}.plan.json",
                            json.dumps(part.prepared.plan.plan_json(), indent=2) + "\n")
    for name in COPIED:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    return result


def write_sidecar(result: FolderBuild, engines: dict[str, str] | None = None, *, tensor_parallel: int | None = None,
                  rank_sets: dict[str, dict] | None = None, built: bool = False) -> Path:
    """pipeline.json: the parts (engine file when built), their forms and I/O, the generation settings. With
    `tensor_parallel` N (build DIR --tp N) each part also names its rank set (`plan`: ROLE.tp.json, from
    `rank_sets`: role -> that plan) and each rank's engine (`ranks`), which rank r's process of `run OUT`
    takes (runtime/ranks.py); `onnx` stays the verified form the ranks were split from and checked against."""
    engines = engines or {}
    parts = {}
    for p in result.parts:
        if tensor_parallel is None:
            parts[p.role] = p.entry(engines.get(p.role, f"{p.role}.engine"))
            continue
        row = p.entry(None)
        rank_set = (rank_sets or {}).get(p.role)
        if rank_set is not None:
            row.update(plan=f"{p.role}.tp.json", ranks=[r["engine"] for r in rank_set["ranks"]])
        elif not p.error:
            row["error"] = f"its {tensor_parallel} rank forms were not written (the split did not verify)"
        parts[p.role] = row
    data = {"kind": result.kind, "source": str(result.source), "parts": parts,
            "generation": generation_settings(result.source), "built": bool(engines) or built}
    if tensor_parallel is not None:
        data = {"tensor_parallel": tensor_parallel, **data}
    return onnxio.atomic_write(result.out_dir / PIPELINE_JSON, json.dumps(data, indent=2) + "\n")
