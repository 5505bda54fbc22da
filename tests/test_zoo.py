"""The zoo: listing, site counts from the configs, exports and the record of exporter failures."""

import collections
import json

import onnx
import pytest
from conftest import zoo_cases

from trtattn import zoo
from trtattn.cli import main
from trtattn.zoo.torch_export import ExportError


def test_zoo_list_json(capsys):
    assert main(["zoo", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(zoo.ZOO)
    for r in rows:
        assert set(r) == {"name", "exporters", "expected_sites"}
        assert r["expected_sites"] > 0
        assert set(r["exporters"]) <= {"torchscript", "dynamo"} and r["exporters"]
    # the families and variants the zoo promises
    for name in ["bart", "whisper", "whisper-decoder-cache", "swin", "vit", "bert", "gpt2", "llama",
                 "llama-cache", "gemma3", "t5", "llama-sdpa", "bart-sdpa"]:
        assert name in zoo.ZOO


def test_expected_sites_come_from_the_config():
    assert zoo.get("bart").expected_sites == 2 + 2 * 2  # encoder self + decoder self and cross
    assert zoo.get("t5").expected_sites == 2 + 2 * 2
    assert zoo.get("swin").expected_sites == 4  # depths [2, 2]
    assert zoo.get("whisper-decoder-cache").expected_sites == 4
    assert zoo.get("gemma3").config().head_dim == 256
    assert zoo.get("llama").config().num_key_value_heads == 2


@pytest.mark.parametrize("name,exporter", zoo_cases())
def test_export_has_the_expected_attention_count(zoo_export, name, exporter):
    """Counted in the graph, independently of the matcher: one Softmax or Attention op per site."""
    model = onnx.load(str(zoo_export(name, exporter)))
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["Softmax"] + ops["Attention"] == zoo.get(name).expected_sites
    meta = json.loads({p.key: p.value for p in model.metadata_props}["trtattn.inputs"])
    assert meta["zoo"] == name and meta["exporter"] == exporter
    assert set(meta["inputs"]) == {i.name for i in model.graph.input}


@pytest.mark.parametrize("name,exporter", [(n, x) for n, rec in zoo.UNSUPPORTED.items() for x in rec])
def test_recorded_export_failures_still_fail(tmp_path, name, exporter):
    """The zoo says why an exporter cannot export an entry; the record must stay true."""
    entry = zoo.get(name)
    assert exporter not in entry.exporters
    import dataclasses

    from trtattn.zoo import torch_export

    with pytest.raises(ExportError):
        torch_export.export_entry(dataclasses.replace(entry, unsupported={}), exporter, tmp_path / "x.onnx")


def test_export_refuses_to_overwrite(tmp_path):
    out = tmp_path / "m.onnx"
    out.write_text("keep me")
    with pytest.raises(Exception, match="exists"):
        zoo.export("vit", "torchscript", out)
    assert out.read_text() == "keep me"
