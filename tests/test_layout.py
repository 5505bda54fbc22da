"""The house's joints: the top-level names do not shadow subpackages, the form record lives in the contract
(runtime and routes read and write it there), and a site's status keeps its string in JSON reports."""

import ast
import json
import pathlib
import subprocess
import sys

import onnx

import trtattn
from trtattn.contract import FORM_METADATA, form_record, record_form
from trtattn.site import SiteStatus


def test_top_level_names_do_not_shadow_the_subpackages():
    code = ("import types, trtattn, trtattn.match, trtattn.routes.prepare; "
            "assert isinstance(trtattn.match, types.ModuleType), trtattn.match; "
            "assert callable(trtattn.find_attention) and callable(trtattn.match.match); "
            "assert callable(trtattn.routes.prepare.prepare)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_form_record_is_written_once_and_read_back():
    model = onnx.ModelProto()
    assert form_record(model) == {}
    record_form(model, "packed", [])
    record_form(model, "padded", ["attention_mask"])  # replaces, never duplicates
    assert [p.key for p in model.metadata_props] == [FORM_METADATA]
    assert form_record(model) == {"form": "padded", "right_padded": ["attention_mask"]}
    model.metadata_props[0].value = "not json"
    assert form_record(model) == {}


def test_site_status_keeps_its_string_in_json():
    assert json.loads(json.dumps({"status": SiteStatus.NOT_FUSED})) == {"status": "not fused"}
    assert SiteStatus.FUSED == "fused" and SiteStatus("not fused") is SiteStatus.NOT_FUSED


def test_no_function_in_the_package_is_over_100_lines():
    root = pathlib.Path(trtattn.__file__).parent
    long = [f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted(root.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > 100]
    assert not long, long
