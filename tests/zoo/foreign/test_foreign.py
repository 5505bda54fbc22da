"""The foreign-export corpus (tests/data/foreign/, made by trtattn/zoo/foreign/make.py): files written by
tf2onnx, paddle2onnx, jax2onnx, onnxconverter-common, onnxsim, onnxslim, ONNX Runtime's optimizer and
quantize_dynamic, onnx.inliner and low-opset exporters. Every file must end with each expected site found
(0 silent misses) and fused and verified, or listed with a reason that neither the ONNX Attention op nor
IAttention can express it. Files whose fix belongs to another class are xfail(strict) with that class, so
that the fix shows up as XPASS and the mark is removed."""

from __future__ import annotations

import collections
import json
import sys

import onnx
import pytest

from trtattn.graph import validate
from trtattn.graph.shapes import upgrade_opset
from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.zoo.foreign import MANIFEST, ROOT, load_manifest

ROWS = load_manifest()

# file -> why it does not pass yet (the issue-18 class whose fix it waits for)
WAITING: dict[str, str] = {
}

# reasons that mean neither the ONNX Attention op nor IAttention can express the site
INEXPRESSIBLE = ("soft-capped", "quantized inside the attention")


def _ops(model):
    return collections.Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def test_manifest_lists_every_file_small():
    names = {r["file"] for r in ROWS}
    on_disk = {p.name for p in ROOT.glob("*.onnx")}
    assert names == on_disk, f"manifest and folder differ: {sorted(names ^ on_disk)}"
    sizes = {p.name: p.stat().st_size for p in ROOT.glob("*.onnx")}
    assert max(sizes.values()) < 2 * 2**20 and sum(sizes.values()) < 15 * 2**20
    assert all(r["expected_sites"] > 0 and r["exporter_version"] for r in ROWS)
    exporters = {r["exporter"] for r in ROWS}
    assert {"tf2onnx", "paddle2onnx", "jax2onnx", "onnxconverter-common", "onnxsim", "onnxslim", "onnxruntime"} <= exporters
    opsets = {next(o.version for o in onnx.load(ROOT / n, load_external_data=False).opset_import
                   if o.domain in ("", "ai.onnx")) for n in names}
    assert {7, 9, 10, 11} <= opsets, sorted(opsets)
    assert MANIFEST.exists()


def _cases():
    for row in ROWS:
        marks = [pytest.mark.xfail(reason=WAITING[row["file"]], strict=True)] if row["file"] in WAITING else []
        yield pytest.param(row, id=row["file"], marks=marks)


@pytest.mark.parametrize("row", list(_cases()))
def test_corpus_file(row):
    path = ROOT / row["file"]
    model = onnx.load(path)
    validate.check_read(model, path)  # read as the commands read it
    result = fuse_model(model)
    found = len(result.reports)
    assert found == row["expected_sites"], f"{row['expected_sites'] - found} silent misses ({found} found)"
    for r in result.reports:
        if r.status != "fused":
            assert r.reason and any(k in r.reason for k in INEXPRESSIBLE), f"{r.site.name}: {r.reason}"
    fused = [r for r in result.reports if r.status == "fused"]
    assert fused and result.verification.passed is True
    assert _ops(result.model)["Attention"] >= len(fused)
    validate.check(result.model, "the fused model")  # what the commands would write must be valid ONNX


def test_a_model_only_onnx_runtime_accepts_is_read_with_a_note():
    """paddle2onnx's opset-7 export has an int64 Constant, which opset 7's schema does not allow: ONNX's
    strict inference refuses it, ONNX Runtime runs it, so it is read (with a note saying so); a model neither
    accepts is still refused."""
    path = ROOT / "paddle-mha-opset7.paddle2onnx.onnx"
    model = onnx.load(path)
    with pytest.raises(validate.InvalidModelError, match="unsupported type"):
        validate.check(model, str(path))
    note = validate.check_read(model, path)
    assert note and "ONNX Runtime loads it" in note and "unsupported type" in note
    assert validate.check_read(onnx.load(ROOT / "paddle-mha.paddle2onnx.onnx"), "x") is None


def test_a_model_onnx_runtime_refuses_too_is_not_read(tmp_path):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    bad = helper.make_node("Add", ["x", "x"], ["y"])  # y typed int64 below: a type error for both
    graph = helper.make_graph([bad], "g", [x], [helper.make_tensor_value_info("y", TensorProto.INT64, [2])])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(validate.InvalidModelError, match="bad.onnx"):
        validate.check_read(onnx.load(path), path)


def test_an_opset_7_model_written_at_opset_23_gets_an_ir_version_that_types_its_initializers():
    """Under IR 3 an initializer that is not a graph input has no type: the fused opset-7 export was written
    invalid until the upgrade raised the IR version with the opset."""
    model = onnx.load(ROOT / "plain-opset7.torchscript.onnx")
    assert model.ir_version == 3
    upgraded = upgrade_opset(model, 23)
    assert upgraded.ir_version >= onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", 23)])


def test_qattention_is_written_as_onnx_runtime_computes_it():
    """quantize_dynamic over ORT's optimized BERT: each com.microsoft QAttention becomes an integer projection
    (MatMulInteger, int32 accumulation, scaled) and the standard Attention op; the quantized layers after it
    see the same values, so the output matches exactly."""
    model = onnx.load(ROOT / "bert.ort-optimizer-qdyn.onnx")
    assert _ops(model)["com.microsoft:QAttention"] == 2
    sites = match(model).sites
    assert [s.source for s in sites] == ["com.microsoft:QAttention"] * 2
    assert all(s.q_heads == 4 and s.head_size == 16 and s.padding for s in sites)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    ops = _ops(result.model)
    assert ops["com.microsoft:QAttention"] == 0 and ops["Attention"] == 2
    assert ops["MatMulInteger"] == _ops(model)["MatMulInteger"] + 2
    assert result.verification.max_abs_err <= 1e-6


@pytest.mark.parametrize("op", ["DecoderMaskedSelfAttention", "LongformerAttention", "PackedAttention",
                                "SparseAttention"])
def test_other_contrib_attention_ops_are_listed_not_silent(op):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])
    node = helper.make_node(op, ["x"], ["y"], domain="com.microsoft", num_heads=2, name="contrib")
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    (site,) = match(model).sites
    assert site.source == f"com.microsoft:{op}" and site.q_heads == 2


def test_make_regenerates_a_corpus_file(tmp_path):
    """make.py's in-environment recipes still run: the opset-7 export comes out as the manifest says."""
    pytest.importorskip("torch", reason="the corpus recipes export with torch (the `export` extra)")
    from trtattn.zoo.foreign import make, tools

    name = "plain-opset7.torchscript.onnx"
    (row,) = tools.make(tmp_path, [name])
    committed = next(r for r in ROWS if r["file"] == name)
    assert {k: row[k] for k in ("file", "exporter", "expected_sites", "exercises")} == \
        {k: committed[k] for k in ("file", "exporter", "expected_sites", "exercises")}
    model = onnx.load(tmp_path / name)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 7
    assert len(match(model).sites) == row["expected_sites"]
    (tmp_path / "manifest.json").write_text(json.dumps([row]))
    (tmp_path / name).write_bytes(b"x" * (make.MAX_FILE + 1))
    with pytest.raises(SystemExit, match="corpus files stay under"):  # make.py refuses a file over 2 MB
        make.main(["--out", str(tmp_path), "--skip-tools"])


@pytest.mark.parametrize("name,tool", [("bert-fp16-keepio.converter.onnx", "onnxconverter_common"),
                                       ("bert-fp16.converter.onnx", "onnxconverter_common"),
                                       ("llama.onnxslim.onnx", "onnxslim")])
def test_make_regenerates_a_tool_derived_file(name, tool, zoo_export, tmp_path, monkeypatch):
    """The fp16-converter and onnxslim recipes run on the session's zoo exports (make.py exports afresh) and
    give the committed file's manifest row, its I/O types and its sites."""
    pytest.importorskip(tool)
    from trtattn.zoo.foreign import tools

    monkeypatch.setattr(tools, "_zoo", lambda zoo_name, tmp, opset=None: onnx.load(zoo_export(zoo_name, "torchscript")))
    (row,) = tools.make(tmp_path, [name])
    committed = next(r for r in ROWS if r["file"] == name)
    keys = ("file", "exporter", "source", "expected_sites", "exercises")
    assert {k: row[k] for k in keys} == {k: committed[k] for k in keys}
    model, was = onnx.load(tmp_path / name), onnx.load(ROOT / name)
    io_types = lambda m: [(v.name, v.type.tensor_type.elem_type) for v in [*m.graph.input, *m.graph.output]]  # noqa: E731
    assert io_types(model) == io_types(was)
    assert not any(p.key.startswith("trtattn.") for p in model.metadata_props)  # a user's file carries no roles
    assert len(match(model).sites) == row["expected_sites"]


def test_the_tf2onnx_script_imports_without_tensorflow_and_names_the_corpus_files():
    """tf_keras.py imports tensorflow when a recipe runs: here (no TensorFlow) its file names can be read, and
    they are the corpus's tf2onnx files."""
    from trtattn.zoo.foreign import tf_keras

    assert set(tf_keras.RECIPES) == {r["file"] for r in ROWS if r["exporter"] == "tf2onnx"}


def test_the_tf2onnx_script_without_tensorflow_says_where_it_runs(tmp_path):
    from trtattn.zoo.foreign import make

    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorflow is importable here: the script would run")
    with pytest.raises(SystemExit, match="tf_keras.py failed(.|\\n)*tf_keras.py: No module named .*foreign-tf extra"):
        make.run_script("tf", sys.executable, tmp_path)


def test_make_only_parses_file_names_and_refuses_what_it_cannot_make(capsys, monkeypatch):
    from trtattn.zoo.foreign import make

    for kind in make.SCRIPTS:  # (a developer's environment may name the scripts' Pythons)
        monkeypatch.delenv(f"TRTATTN_FOREIGN_{kind.upper()}", raising=False)

    args = make.parse_args(["--only", "bert.onnxsim.onnx", "plain-opset7.torchscript.onnx"])
    assert args.only == ["bert.onnxsim.onnx", "plain-opset7.torchscript.onnx"] and not args.skip_tools
    args = make.parse_args(["--only", "mha.tf2onnx.onnx", "--skip-tools", "--tf", "py"])  # named by the script
    assert args.only == ["mha.tf2onnx.onnx"] and args.tf == "py"
    assert make.parse_args([]).only is None
    for argv, why in ((["--only", "tf-mha.tf2onnx.onnx"], "tf-mha.tf2onnx.onnx: not a tool-derived file"),
                      (["--only", "bert.onnxsim.onnx", "--skip-tools", "--tf", "py"],
                       "bert.onnxsim.onnx: tool-derived, and --skip-tools is given"),
                      (["--only"], "expected at least one argument")):
        with pytest.raises(SystemExit):
            make.parse_args(argv)
        assert why in capsys.readouterr().err


def test_make_only_remakes_the_named_file_and_keeps_the_other_rows(tmp_path, monkeypatch):
    from trtattn.zoo.foreign import make, tools

    kept = {**ROWS[0], "source": "as committed"}
    name = next(r["file"] for r in ROWS if r["file"] in tools.RECIPES and r["file"] != kept["file"])
    (tmp_path / "manifest.json").write_text(json.dumps([kept, {**kept, "file": name, "source": "old"}]))
    (tmp_path / kept["file"]).write_bytes(b"kept")
    asked = []

    def fake_make(out, only=None):  # the recipes export with torch: only which ones are asked is checked here
        asked.append(only)
        (out / name).write_bytes(b"new")
        return [{**kept, "file": name, "source": "remade"}]

    monkeypatch.setattr(tools, "make", fake_make)
    assert make.main(["--out", str(tmp_path), "--only", name]) == 0
    assert asked == [[name]]
    rows = {r["file"]: r for r in json.loads((tmp_path / "manifest.json").read_text())}
    assert rows == {kept["file"]: kept, name: {**kept, "file": name, "source": "remade"}}
    assert (tmp_path / kept["file"]).read_bytes() == b"kept"


def test_make_only_copies_only_the_named_files_a_script_writes(tmp_path):
    """A stand-alone script writes all its files; --only keeps the named ones (a stand-in for the foreign
    venv's Python: it writes two files into the folder it is given and prints their rows)."""
    from trtattn.zoo.foreign import make

    python = tmp_path / "python"
    python.write_text('#!/bin/sh\nfor f in a b; do echo $f > "$2/$f.onnx"; echo "{\\"file\\": \\"$f.onnx\\"}"; done\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    assert make.run_script("tf", str(python), out, {"b.onnx"}) == [{"file": "b.onnx"}]
    assert [p.name for p in out.iterdir()] == ["b.onnx"]
    assert [r["file"] for r in make.run_script("tf", str(python), out)] == ["a.onnx", "b.onnx"]


@pytest.mark.parametrize("name", ["plain-opset7.torchscript.onnx", "plain-opset9.torchscript.onnx",
                                  "paddle-mha-opset7.paddle2onnx.onnx", "bert-opset10.torchscript.onnx"])
def test_normalize_writes_low_opset_exports_as_valid_onnx(name):
    """normalize keeps the export's opset: what it writes for an IR-3 export must still type its weights."""
    from trtattn.rewrite.normalize import normalize_model

    model = onnx.load(ROOT / name)
    validate.check_read(model, ROOT / name)
    result = normalize_model(model)
    assert result.verification.passed is True
    validate.check(result.model, "the normalized model")
