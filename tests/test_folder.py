"""Export folders as one unit (trtattn.folder, `fuse DIR`, `normalize DIR`) and generation through a
folder's parts (trtattn.runtime.pipeline, `run DIR --generate`), on folders written from the zoo in the
layout Optimum uses (model.onnx; encoder_model.onnx + decoder_model.onnx + decoder_with_past_model.onnx)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat

import numpy as np
import onnx
import pytest
from export_folders import encoder_decoder_folder, run_tokens

import trtattn
from tests.conftest import sha256
from trtattn.cli import main
from trtattn.errors import TrtattnError
from trtattn.folder import FileResult, FolderResult, check_folders, fuse_folder, process_folder
from trtattn.graph.user_inputs import InputsUsed
from trtattn.rewrite.fuse import SiteReport
from trtattn.rewrite.normalize import SiteNormalization
from trtattn.runtime import OrtSession, generate, generate_encoder_decoder
from trtattn.runtime.pipeline import generate_pipeline, load_pipeline
from trtattn.site import AttentionSite, SiteKind, SiteStatus
from trtattn.testing.graphs import attention_model
from trtattn.verification import Verification


def _ops(path):
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


@pytest.fixture(scope="module")
def llama_folder(zoo_dir, tmp_path_factory):
    """A decoder-only export folder: the zoo's Llama LM step as model.onnx beside config files."""
    from trtattn.zoo import generation

    folder = tmp_path_factory.mktemp("llama") / "export"
    folder.mkdir()
    model = onnx.load(str(generation.export_family("llama", zoo_dir)["llama-lm"]))
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx_data",
              size_threshold=0)  # as Optimum writes large models
    head = onnx.helper.make_graph(  # a model with no attention, its weight in a data file of its own
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "head",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.ones((8, 4), np.float32), "w")])
    onnx.save(onnx.helper.make_model(head), str(folder / "head.onnx"), save_as_external_data=True,
              location="head.bin", size_threshold=0)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 999, "pad_token_id": 0}))
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


@pytest.fixture(scope="module")
def whisper_folder(zoo_dir, tmp_path_factory):
    return encoder_decoder_folder("whisper", zoo_dir, tmp_path_factory.mktemp("whisper"), 3)


def _snapshot(folder):
    """Each file's hash by its path in the folder ("sub/head.bin")."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fuse_folder_fuses_every_model_copies_the_rest_and_never_touches_the_input(llama_folder, tmp_path):
    before = _snapshot(llama_folder)
    out = tmp_path / "fused"
    report = tmp_path / "r.json"
    assert main(["fuse", str(llama_folder), "-o", str(out), "--report", str(report)]) == 0
    assert _snapshot(llama_folder) == before
    assert "Attention" in _ops(out / "model.onnx") and "Attention" not in _ops(llama_folder / "model.onnx")
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (llama_folder / name).read_bytes()
    data = json.loads(report.read_text())
    assert data["ok"] and [f["file"] for f in data["files"] if f["action"] == "fused"] == ["model.onnx"]
    # external data: the fused model writes its own, the old file is not copied; an unchanged model keeps its
    assert (out / "model.onnx.data").exists() and not (out / "model.onnx_data").exists()
    assert [f["action"] for f in data["files"] if f["file"] == "head.onnx"] == ["unchanged"]
    for name in ("head.onnx", "head.bin"):
        assert (out / name).read_bytes() == (llama_folder / name).read_bytes()
    assert not [f for f in data["files"] if f["file"] in ("model.onnx_data", "head.bin")]  # data: not "other files"
    assert len(data["sites"]) == 2 and all(s["file"] == "model.onnx" and s["status"] == "fused" for s in data["sites"])
    # an existing output is refused without --force, replaced with it; the input folder is never an output
    assert main(["fuse", str(llama_folder), "-o", str(out)]) == 2
    assert main(["fuse", str(llama_folder), "-o", str(llama_folder / "inside")]) == 2
    assert _snapshot(llama_folder) == before


def test_fuse_folder_writes_nothing_when_a_model_does_not_verify(llama_folder, tmp_path, monkeypatch):
    import trtattn.folder as folder

    real = folder._transform

    def failing(*args):  # the real fuse, its verification then marked failed
        result = real(*args)
        result.verification.passed = False
        return result

    monkeypatch.setattr(folder, "_transform", failing)
    out = tmp_path / "fused"
    out.mkdir()  # an existing output, replaced only when something is written (--force)
    result = fuse_folder(llama_folder, out, force=True)
    assert not result.ok and result.output is None and not list(out.iterdir())
    assert [f.action for f in result.models if f.path == "model.onnx"] == ["not written"]
    assert [p.name for p in tmp_path.iterdir()] == ["fused"]  # no scratch left behind
    partial = fuse_folder(llama_folder, out, force=True, allow_partial=True)  # the failed model copied unchanged
    assert partial.output == out and (out / "model.onnx").read_bytes() == (llama_folder / "model.onnx").read_bytes()


def test_folder_with_no_model_is_refused(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "config.json").write_text("{}")
    with pytest.raises(TrtattnError, match="directory with no ONNX model"):
        fuse_folder(tmp_path / "in", tmp_path / "out")


def test_run_folder_generates_as_the_decoder_step_does(llama_folder, tmp_path, capsys):
    step = OrtSession(str(llama_folder / "model.onnx"))
    want = generate(step, [[5, 6, 7]], 6).tokens[0]
    pipeline = load_pipeline(llama_folder)
    assert pipeline.kind == "decoder-only" and pipeline.settings["eos_token_id"] == 999
    assert generate_pipeline(pipeline, {"decoder": step}, [[5, 6, 7]], 6) == [want]
    assert trtattn.generate(llama_folder, [[5, 6, 7]], 6) == [want]
    capsys.readouterr()
    save = tmp_path / "tokens.npz"
    assert main(["run", str(llama_folder), "--generate", "6", "--prompt", "5,6,7", "--save", str(save)]) == 0
    assert f"request 0: {' '.join(map(str, want))}" in capsys.readouterr().out
    assert np.load(save)["tokens"][0].tolist() == want


def test_run_folder_stops_at_the_eos_of_generation_config(llama_folder, tmp_path):
    step = OrtSession(str(llama_folder / "model.onnx"))
    tokens = generate(step, [[5, 6, 7]], 6).tokens[0]
    folder = tmp_path / "eos"
    shutil.copytree(llama_folder, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": tokens[2]}))
    got, = generate_pipeline(load_pipeline(folder), {"decoder": step}, [[5, 6, 7]], 6)
    assert got == tokens[:tokens.index(tokens[2]) + 1]


def test_run_encoder_decoder_folder_generates_as_the_parts_do(whisper_folder):
    features = np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32)
    parts = {role: OrtSession(str(p)) for role, p in load_pipeline(whisper_folder).parts.items()}
    want = generate_encoder_decoder(parts["encoder"], parts["decoder"], parts["decoder_with_past"], features, [[3]],
                                    5).tokens[0]
    pipeline = load_pipeline(whisper_folder)
    assert pipeline.kind == "encoder-decoder" and not pipeline.merged
    got, = generate_pipeline(pipeline, parts, None, 5, encoder_inputs=[{"input_features": features}])
    assert got == want


def test_build_folder_writes_forms_plans_and_pipeline_sidecar_and_its_forms_generate_alike(llama_folder, tmp_path,
                                                                                               capsys):
    """`build DIR` without TensorRT: the verified kv-cache form of the decoder, its plan and pipeline.json
    (parts, form, I/O, generation settings), exit 4; `run OUT --backend ort` decodes through the forms
    with the same tokens as the export folder."""
    from trtattn.cli.common import NO_TRT_EXIT

    code = main(["build", str(llama_folder), "--out-dir", str(tmp_path), "--precision", "fp32"])
    out = tmp_path / llama_folder.name
    sidecar = json.loads((out / "pipeline.json").read_text())
    assert sidecar["kind"] == "decoder-only" and sidecar["generation"]["eos_token_id"] == 999
    part = sidecar["parts"]["decoder"]
    assert part["form"] == "kv-cache" and part["source"] == "model.onnx" and part["sites"] == 2
    assert "input_ids" in {i["name"] for i in part["inputs"]} and part["profiles"]
    assert (out / part["onnx"]).exists() and (out / "decoder.plan.json").exists()
    assert (out / "generation_config.json").read_bytes() == (llama_folder / "generation_config.json").read_bytes()
    if code == NO_TRT_EXIT:
        assert main(["run", str(out), "--generate", "4", "--prompt", "5,6,7"]) == 2  # no engines to run
    capsys.readouterr()
    assert main(["run", str(out), "--backend", "ort", "--generate", "6", "--prompt", "5,6,7", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["requests"][0]["tokens"]
    assert [got] == trtattn.generate(llama_folder, [[5, 6, 7]], 6)


def test_build_encoder_decoder_folder_generates_through_its_kv_cache_form_as_the_export_does(whisper_folder, tmp_path,
                                                                                           capsys):
    """`build DIR` on an encoder-decoder folder: the encoder and the first decoder step in the padded form, the
    decoder with past as the kv-cache form (self-attention over its static cache, the cross-attention K/V of
    the first step as plain inputs); `run OUT --backend ort` gives the export folder's tokens."""
    main(["build", str(whisper_folder), "--out-dir", str(tmp_path), "--precision", "fp32"])
    out = tmp_path / whisper_folder.name
    forms = {role: p["form"] for role, p in json.loads((out / "pipeline.json").read_text())["parts"].items()}
    assert forms == {"encoder": "padded", "decoder": "padded", "decoder_with_past": "kv-cache"}
    features = tmp_path / "features.npy"
    np.save(features, np.random.default_rng(0).standard_normal((2, 16, 32)).astype(np.float32))
    want = run_tokens(capsys, whisper_folder, "--features", str(features))
    assert len(want) == 2 and len(want[0]) > 1
    assert run_tokens(capsys, out, "--backend", "ort", "--features", str(features)) == want


@pytest.mark.slow  # exporting the three parts afresh takes ~15 s
@pytest.mark.parametrize("family,form", [("bart", "kv-cache"), ("t5", "padded")])
def test_build_text_encoder_decoder_folder_generates_the_export_folders_tokens(family, form, zoo_dir, tmp_path,
                                                                                capsys):
    """BART as Optimum cuts it: the kv-cache form's cross-attention reads the encoder's padding mask as
    lengths (kept as an input, set once per request). T5's decoder self-attention adds a relative position
    bias derived from the cache's length, which the kv-cache form has no place for: its decoder with past
    is the padded form (its past growing), and the table and pipeline.json say why. Either way the built
    folder's tokens equal the export folder's, prompt by prompt."""
    folder = encoder_decoder_folder(family, zoo_dir, tmp_path, 2)
    assert main(["build", str(folder), "--out-dir", str(tmp_path / "built"), "--precision", "fp32"]) in (0, 4)
    out = tmp_path / "built" / folder.name
    part = json.loads((out / "pipeline.json").read_text())["parts"]["decoder_with_past"]
    assert part["form"] == form and "error" not in part
    if form == "kv-cache":
        assert "encoder_attention_mask" in {i["name"] for i in part["inputs"]} and "note" not in part
    else:
        assert "SelfAttention" in part["note"] and "bias" in part["note"]
    prompts = [["--prompt", "100,101,102,103,104,105,106"], ["--prompt", "8"], ["--prompt", "5,6,7,9,11"]]
    want = [run_tokens(capsys, folder, *p)[0] for p in prompts]
    assert len({tuple(t) for t in want}) == 3 and any(len(set(t)) > 1 for t in want)  # not one token repeated
    assert [run_tokens(capsys, out, "--backend", "ort", *p)[0] for p in prompts] == want


def _merged_folder(folder, root):
    """The encoder-decoder folder with its two decoders merged as Optimum merges them."""
    from trtattn.zoo.derived import merge_decoders

    merged_folder = root / "merged"
    merged_folder.mkdir()
    shutil.copy(folder / "encoder_model.onnx", merged_folder)
    shutil.copy(folder / "generation_config.json", merged_folder)
    merged = merge_decoders(onnx.load(str(folder / "decoder_model.onnx")),
                            onnx.load(str(folder / "decoder_with_past_model.onnx")))
    onnx.save(merged, str(merged_folder / "decoder_model_merged.onnx"))
    return merged_folder


def test_merged_decoders_placeholder_keeps_the_outputs_static_dims():
    """merge_decoders: an output the cached step lacks is an empty constant in its branch, [0, 4] for an
    output declared [batch, 4] (a [0, 0] one is invalid ONNX under strict shape inference); a mask whose
    length differs between the two gets a dim of its own; both branches run."""
    from onnx import TensorProto, helper

    from trtattn.zoo.derived import merge_decoders

    def decoder(outputs, mask_len):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
        mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", mask_len])
        nodes = [helper.make_node("Identity", ["x"], [o]) for o in outputs]
        return helper.make_model(helper.make_graph(
            nodes, "d", [x, mask], [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["batch", 4]) for o in outputs]),
            opset_imports=[helper.make_opsetid("", 17)])

    merged = merge_decoders(decoder(["logits", "present.0.encoder.key"], "seq"), decoder(["logits"], "past+seq"))
    onnx.checker.check_model(merged, full_check=True)
    mask = next(i for i in merged.graph.input if i.name == "attention_mask")
    assert [d.dim_param for d in mask.type.tensor_type.shape.dim] == ["batch", "attention_mask_sequence_length"]
    session = OrtSession(merged, name="merged")
    feeds = {"x": np.ones((2, 4), np.float32), "attention_mask": np.ones((2, 3), np.int64)}
    first = session.run({**feeds, "use_cache_branch": np.asarray([False])})
    cached = session.run({**feeds, "use_cache_branch": np.asarray([True])})
    assert first["present.0.encoder.key"].shape == (2, 4) and cached["present.0.encoder.key"].shape == (0, 4)
    assert (cached["logits"] == first["logits"]).all()


def test_fuse_merged_decoder_folder_keeps_the_inputs_only_one_branch_reads(whisper_folder, tmp_path, capsys):
    """`fuse DIR` fuses each branch as a model of its own (which reads only its branch's inputs) and puts
    them back into the If: the fused merged decoder takes every input the original takes (the first
    step's encoder_hidden_states, the cached step's past) and generates the same tokens."""
    folder = _merged_folder(whisper_folder, tmp_path)
    assert main(["fuse", str(folder), "-o", str(tmp_path / "fused")]) == 0
    original, fused = (onnx.load(str(f / "decoder_model_merged.onnx")) for f in (folder, tmp_path / "fused"))
    assert [i.name for i in fused.graph.input] == [i.name for i in original.graph.input]
    assert _ops(tmp_path / "fused" / "decoder_model_merged.onnx") == ["If"]
    features = tmp_path / "features.npy"
    np.save(features, np.random.default_rng(1).standard_normal((2, 16, 32)).astype(np.float32))
    want = run_tokens(capsys, folder, "--features", str(features))
    assert run_tokens(capsys, tmp_path / "fused", "--features", str(features)) == want


def test_build_merged_decoder_folder_generates_the_export_folders_tokens(whisper_folder, tmp_path, capsys):
    """An encoder-decoder folder whose decoder is Optimum's merged decoder (decoder_model_merged.onnx: an If
    on use_cache_branch, the cache branch's cross-attention presents empty, no trtattn metadata): `build DIR`
    prepares both branches as their own parts, with only the inputs each branch reads, and `run OUT`
    gives the tokens `run DIR` gives, request by request."""
    folder = _merged_folder(whisper_folder, tmp_path)
    capsys.readouterr()
    assert main(["build", str(folder), "--out-dir", str(tmp_path / "built"), "--precision", "fp32"]) in (0, 4)
    listed = capsys.readouterr().out  # the parts table names the branch each part is
    assert re.search(r"^decoder_with_past +decoder_model_merged\.onnx +use_cache_branch=True +kv-cache", listed, re.M)
    out = tmp_path / "built" / folder.name
    parts = json.loads((out / "pipeline.json").read_text())["parts"]
    assert {role: (p["form"], p["branch"], p["sites"]) for role, p in parts.items()} == {
        "encoder": ("padded", None, 2), "decoder": ("padded", "use_cache_branch=False", 4),
        "decoder_with_past": ("kv-cache", "use_cache_branch=True", 4)}
    first = {i["name"] for i in parts["decoder"]["inputs"]}
    assert "encoder_hidden_states" in first and not any(n.startswith("past_key_values") for n in first)
    assert "encoder_hidden_states" not in {i["name"] for i in parts["decoder_with_past"]["inputs"]}
    features = tmp_path / "features.npy"
    np.save(features, np.random.default_rng(0).standard_normal((2, 16, 32)).astype(np.float32))
    want = run_tokens(capsys, folder, "--features", str(features))
    assert want == run_tokens(capsys, whisper_folder, "--features", str(features))  # the merge changes nothing
    assert len(want) == 2 and any(len(set(t)) > 1 for t in want)
    assert run_tokens(capsys, out, "--backend", "ort", "--features", str(features)) == want


@pytest.mark.slow  # exporting BART's parts afresh
def test_build_merged_bart_folder_without_metadata_keeps_the_kv_cache_form(zoo_dir, tmp_path, capsys):
    """BART as a user's Optimum folder: merged decoder, no trtattn metadata in any part (every role guessed
    from the graph). The cached step is still the kv-cache form, its cross-attention reading the encoder's
    padding mask as lengths, and the built folder's tokens equal the export folder's, prompt by prompt."""
    folder = _merged_folder(encoder_decoder_folder("bart", zoo_dir, tmp_path, 2), tmp_path)
    for path in folder.glob("*.onnx"):
        model = onnx.load(str(path))
        del model.metadata_props[:]
        onnx.save(model, str(path))
    assert main(["build", str(folder), "--out-dir", str(tmp_path / "built"), "--precision", "fp32"]) in (0, 4)
    out = tmp_path / "built" / folder.name
    part = json.loads((out / "pipeline.json").read_text())["parts"]["decoder_with_past"]
    assert (part["form"], part["branch"]) == ("kv-cache", "use_cache_branch=True") and "note" not in part
    assert "encoder_attention_mask" in {i["name"] for i in part["inputs"]}
    prompts = [["--prompt", "100,101,102,103,104,105,106"], ["--prompt", "8"], ["--prompt", "5,6,7,9,11"]]
    want = [run_tokens(capsys, folder, *p)[0] for p in prompts]
    assert len({tuple(t) for t in want}) == 3
    assert [run_tokens(capsys, out, "--backend", "ort", *p)[0] for p in prompts] == want


def test_zoo_merged_decoder_fuses_both_branches_and_runs_both_ways_like_the_original(zoo_export):
    """Class 6 on the zoo's llama-merged (Optimum's merge of the without- and with-cache decoders): each
    branch verified on its own, every site of both fused, and the fused If runs both ways as the original."""
    from trtattn.graph.branches import take_branch
    from trtattn.graph.feeds import make_feeds
    from trtattn.rewrite.fuse import fuse_model

    original = onnx.load(str(zoo_export("llama-merged", "torchscript")))
    result = fuse_model(original)
    assert result.ok and set(result.verification.branches) == {"use_cache_branch=False", "use_cache_branch=True"}
    names = [r.site.name for r in result.reports]
    assert len(names) == 4 and sum(n.startswith("use_cache_branch=True: ") for n in names) == 2
    assert all(r.status == "fused" and r.site.graph for r in result.reports)
    onnx.checker.check_model(result.model)
    a, b = OrtSession(original, name="original"), OrtSession(result.model, name="fused")
    past = make_feeds(take_branch(original, "use_cache_branch", True), seed=1)
    for use_cache in (False, True):  # (the first step's branch reads no past, but the If takes one)
        feeds = {**past, **make_feeds(take_branch(original, "use_cache_branch", use_cache), seed=1)}
        feeds["use_cache_branch"] = np.asarray([use_cache])
        want, got = a.run(feeds), b.run(feeds)
        assert all(np.abs(want[k] - got[k]).max() <= 1e-4 for k in want)


@pytest.mark.slow
def test_normalize_folder_normalizes_every_model_and_reports_per_file(llama_folder, tmp_path):
    out, report = tmp_path / "norm", tmp_path / "r.json"
    assert main(["normalize", str(llama_folder), "-o", str(out), "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["mode"] == "normalize" and data["ok"]
    model = next(f for f in data["files"] if f["file"] == "model.onnx")
    assert model["sites"] == 2 and model["not_done"] == 0 and model["action"] in ("normalized", "unchanged")
    assert (out / "config.json").read_bytes() == (llama_folder / "config.json").read_bytes()
    assert main(["normalize", str(llama_folder), "-o", str(out), "--quantize", "int8"]) == 2  # per model, not a folder


def test_build_folder_verifies_each_part_on_its_own_inputs_file(llama_folder, tmp_path):
    """`build DIR --inputs INPUTS_DIR`: the decoder is verified on INPUTS_DIR/decoder.npz (its record names the
    file); a single file, or a file naming no part, is refused in one line before anything is prepared."""
    from trtattn.folder_engines import prepare_folder
    from trtattn.graph.feeds import make_feeds

    model = onnx.load(str(llama_folder / "model.onnx"), load_external_data=False)
    given = tmp_path / "inputs"
    given.mkdir()
    np.savez(given / "decoder.npz", **make_feeds(model, seed=5))
    result = prepare_folder(llama_folder, tmp_path / "out", precision="fp32", inputs=given)
    part, = result.parts
    assert part.error is None and part.prepared.inputs is not None
    assert part.prepared.verification.inputs == InputsUsed("file", str(given / "decoder.npz"), 1)
    with pytest.raises(TrtattnError, match="give a folder of one inputs file per part .decoder.npz"):
        prepare_folder(llama_folder, tmp_path / "out2", inputs=given / "decoder.npz")
    np.savez(given / "encoder.npz", **make_feeds(model, seed=5))
    with pytest.raises(TrtattnError, match="encoder.npz names no part of this folder"):
        prepare_folder(llama_folder, tmp_path / "out3", inputs=given)
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out3").exists()


# Survivors of mutating folder.py (benchmarks/mutate.py, base d3efd07), on small folders written here: the
# report's rows and verdicts, the refusals before any work, a folder fused and normalized model by model.
def _site(name: str = "attn") -> AttentionSite:
    return AttentionSite(name=name, kind=SiteKind.SELF, query="q", key="k", value="v", output="y")


def test_a_files_row_counts_what_was_done_and_what_was_not():
    sites = [SiteReport(_site()), SiteReport(_site(), SiteStatus.NOT_FUSED, "why"),
             SiteNormalization(_site(), SiteStatus.REWRITTEN), SiteNormalization(_site(), SiteStatus.SKIPPED, "why"),
             SiteNormalization(_site(), SiteStatus.KEPT, "already")]
    row = FileResult("m.onnx", "fused", sites, verification=Verification(passed=True, max_abs_err=1.5e-6)).row()
    assert row == {"file": "m.onnx", "action": "fused", "sites": 5, "done": 2, "not_done": 2, "ok": True,
                   "verification": "passed (1.5e-06)"}


@pytest.mark.parametrize("verification,verdict", [
    (Verification.nothing(), "-"), (Verification(note="no input"), "no input"), (Verification(), "not run"),
    (Verification(passed=False, max_abs_err=0.25), "FAILED (0.25)"), (Verification(passed=True), "passed"),
])
def test_the_verdict_says_passed_failed_or_why_not_run(verification, verdict):
    assert FileResult("m.onnx", "fused", verification=verification).row()["verification"] == verdict


def test_the_folder_report_lists_files_sites_and_ignored_by_file(tmp_path):
    fused, failed = SiteReport(_site("a")), SiteReport(_site("b"), SiteStatus.NOT_FUSED, "why")
    files = [FileResult("a.onnx", "fused", [fused], [{"name": "n", "reason": "r"}], Verification(passed=True)),
             FileResult("config.json", "copied"),
             FileResult("b.onnx", "not written", [failed], ok=False)]
    result = FolderResult(tmp_path, None, files)
    assert not result.ok and [f.path for f in result.models] == ["a.onnx", "b.onnx"]
    report = result.report()
    assert report["output"] is None and report["ok"] is False
    assert report["sites"] == [{"file": "a.onnx", **fused.row()}, {"file": "b.onnx", **failed.row()}]
    assert [(r["name"], r["status"]) for r in report["sites"]] == [("a", "fused"), ("b", "not fused")]
    assert report["ignored"] == [{"file": "a.onnx", "name": "n", "reason": "r"}]
    assert report["verification"] == {"a.onnx": {"passed": True}, "b.onnx": {}}
    assert FolderResult(tmp_path, tmp_path / "o", files[:2]).report()["ok"] is True


def test_folders_are_refused_before_any_work(tmp_path):
    src = tmp_path / "src"
    (src / "inner").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrtattnError, match="file: not a folder"):
        check_folders(tmp_path / "file", tmp_path / "out", False)
    for out in (src, src / "inner", tmp_path):
        with pytest.raises(TrtattnError, match="it is the input folder .*, inside it or around it"):
            check_folders(src, out, True)
    (tmp_path / "taken").mkdir()
    with pytest.raises(TrtattnError, match="taken exists \\(use --force to replace it\\)"):
        check_folders(src, tmp_path / "taken", False)
    assert check_folders(src, tmp_path / "taken", True) == (src, tmp_path / "taken")
    with pytest.raises(TrtattnError, match="file exists and is not a folder"):
        check_folders(src, tmp_path / "file", True)
    with pytest.raises(TrtattnError, match="unknown folder mode 'squash'"):
        process_folder(src, tmp_path / "out", mode="squash")
    with pytest.raises(TrtattnError, match="a directory with no ONNX model"):
        process_folder(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture()
def export(tmp_path):
    """model.onnx (an attention to fuse), sub/head.onnx (no attention) with its weight in head.bin, and
    config files."""
    folder = tmp_path / "export"
    (folder / "sub").mkdir(parents=True)
    onnx.save(attention_model(), str(folder / "model.onnx"))
    head = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "head",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.ones((8, 4), np.float32), "w")])
    onnx.save(onnx.helper.make_model(head, opset_imports=[onnx.helper.make_opsetid("", 17)]),
              str(folder / "sub" / "head.onnx"), save_as_external_data=True, location="head.bin", size_threshold=0)
    (folder / "config.json").write_text(json.dumps({"model_type": "test"}))
    (folder / "sub" / "notes.txt").write_text("kept as it is")
    return folder


def test_a_folder_is_fused_model_by_model_and_every_other_file_copied(export, tmp_path):
    before = _snapshot(export)
    out = tmp_path / "out"
    result = process_folder(export, out)
    assert result.ok and result.output == out
    assert {f.path: f.action for f in result.files} == {
        "config.json": "copied", "model.onnx": "fused", "sub/head.onnx": "unchanged", "sub/notes.txt": "copied"}
    assert _snapshot(export) == before  # the input only read
    written = _snapshot(out)
    assert set(written) == {"config.json", "model.onnx", "sub/head.onnx", "sub/head.bin", "sub/notes.txt"}
    for same in ("config.json", "sub/head.onnx", "sub/head.bin", "sub/notes.txt"):
        assert written[same] == before[same], same
    assert [n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node].count("Attention") == 1
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()  # not mkdtemp's 0700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "out"]  # no scratch left beside it


def test_a_model_with_an_attention_not_fused_stops_the_folder_unless_partial(export, tmp_path):
    from trtattn.testing.edits import multiplied

    unfusable = multiplied(attention_model(opset=18, mask_style="additive_input"), "mul", "attention_mask",
                           offset=False)  # a product with no offset after it: listed, not fused
    onnx.save(unfusable, str(export / "model.onnx"))
    out = tmp_path / "out"
    result = process_folder(export, out)
    assert not result.ok and result.output is None and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # the scratch removed
    model = next(f for f in result.files if f.path == "model.onnx")
    assert not model.ok and model.row()["not_done"] == 1
    result = process_folder(export, out, allow_partial=True)
    assert not result.ok and result.output == out and (out / "model.onnx").is_file()
    assert _snapshot(out)["model.onnx"] == _snapshot(export)["model.onnx"]  # nothing fused: copied as it was
    out_again = process_folder(export, out, force=True)  # an existing output replaced only with force
    assert out_again.output is None and (out / "model.onnx").is_file()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_folder_is_normalized_model_by_model(export, tmp_path):
    result = process_folder(export, tmp_path / "out", mode="normalize")
    actions = {f.path: f.action for f in result.files}
    assert result.ok and actions["model.onnx"] == "normalized" and actions["sub/head.onnx"] == "unchanged"
    (site,) = next(f for f in result.files if f.path == "model.onnx").sites
    assert site.status == SiteStatus.REWRITTEN and site.row()["action"] == "rewritten"  # normalize's words
