"""The zoo: listing, site counts from the configs, exports and the record of exporter failures."""

import collections
import json
import multiprocessing
import re
import time

import onnx
import pytest

from tests.conftest import class_cases, ort_run, zoo_cases
from trtattn import zoo
from trtattn.cli import main
from trtattn.zoo.torch_export import ExportError


def _export_slowly(path, log):
    def make(p):
        with open(log, "a") as f:
            f.write("made\n")
        time.sleep(0.3)
        p.write_text("model")

    return zoo.exported(path, make)


def test_an_export_asked_for_by_two_processes_at_once_is_made_once(tmp_path):
    """Two test workers asking for one export: the first makes it, the other waits for it and reads it."""
    path, log = tmp_path / "cache" / "m.onnx", tmp_path / "log"
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    workers = [context.Process(target=_export_slowly, args=(path, log)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert [w.exitcode for w in workers] == [0, 0]
    assert log.read_text() == "made\n" and path.read_text() == "model"
    assert zoo.exported(path, lambda p: pytest.fail("exported again")) == path


def test_zoo_list_json(capsys):
    assert main(["zoo", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(zoo.ZOO)
    for r in rows:
        assert set(r) == {"name", "exporters", "expected_sites", "classes"}
        assert set(r["classes"]) <= set(zoo.CLASSES)
        assert r["expected_sites"] > 0 or r["name"] == "resnet-external"  # nothing to fuse, on purpose
        assert set(r["exporters"]) <= {"torchscript", "dynamo"} and r["exporters"]
    # the families and variants the zoo promises
    for name in ["bart", "whisper", "whisper-decoder-cache", "swin", "vit", "bert", "gpt2", "llama",
                 "llama-cache", "gemma3", "t5", "llama-sdpa", "bart-sdpa"]:
        assert name in zoo.ZOO


def test_every_missed_class_has_entries():
    """Every class of attention issue 10 lists has a zoo entry, real model code where there is one."""
    by_class = collections.defaultdict(list)
    for e in zoo.ZOO.values():
        assert set(e.classes) <= set(zoo.CLASSES), e.name
        for c in e.classes:
            by_class[c].append(e)
    assert set(by_class) == set(zoo.CLASSES)
    torch_code = {c for c, entries in by_class.items() if any(not e.derived for e in entries)}
    assert torch_code >= {"layout3d", "baddbmm", "shape_consumer", "softcap", "bias_in_graph", "dims", "einsum",
                          "single_query", "control_flow"}
    assert all(e.user_shapes for e in by_class["dims"])  # what a user runs them on


def test_expected_sites_come_from_the_config():
    assert zoo.get("bart").expected_sites == 2 + 2 * 2  # encoder self + decoder self and cross
    assert zoo.get("t5").expected_sites == 2 + 2 * 2
    assert zoo.get("swin").expected_sites == 4  # depths [2, 2]
    assert zoo.get("whisper-decoder-cache").expected_sites == 4
    assert zoo.get("gemma3").config().head_dim == 256
    assert zoo.get("llama").config().num_key_value_heads == 2


def _ops(graph: onnx.GraphProto) -> collections.Counter:
    """Op types in a graph and in the subgraphs of its If / Loop / Scan nodes."""
    ops = collections.Counter()
    for node in graph.node:
        ops[node.op_type] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                ops += _ops(attr.g)
    return ops


@pytest.mark.parametrize("name,exporter", zoo_cases())
def test_export_has_the_expected_attention_count(zoo_export, name, exporter):
    """Counted in the graph, independently of the matcher: one Softmax or Attention op per site, also
    in control flow (an If branch holds its own copy of each layer; a Loop body holds each layer once)."""
    model = onnx.load(str(zoo_export(name, exporter)))
    ops = _ops(model.graph)
    assert ops["Softmax"] + ops["Attention"] == zoo.get(name).expected_sites
    props = {p.key: p.value for p in model.metadata_props}
    if "dims" in zoo.get(name).classes:  # as a user's export: no input roles, no dims
        assert "trtattn.inputs" not in props
        meta = json.loads(props["trtattn.zoo"])
    else:
        meta = json.loads(props["trtattn.inputs"])
        assert set(meta["inputs"]) == {i.name for i in model.graph.input}
    assert meta["zoo"] == name and meta["exporter"] == exporter
    assert meta.get("classes", []) == list(zoo.get(name).classes_for(exporter))


# each case tries the real export (15-55 s for most): the fast lane keeps two quick ones, the rest are slow
FAST_FAILURES = {("fsmt", "dynamo"), ("chunked-loop", "dynamo")}


@pytest.mark.parametrize("name,exporter", [(n, x) if (n, x) in FAST_FAILURES else pytest.param(n, x, marks=pytest.mark.slow)
                                           for n, rec in zoo.UNSUPPORTED.items() for x in rec])
def test_recorded_export_failures_still_fail(tmp_path, name, exporter):
    """The zoo says why an exporter cannot export an entry; the record must stay true."""
    entry = zoo.get(name)
    assert exporter not in entry.exporters
    import dataclasses

    from trtattn.zoo import derived, torch_export

    bare = dataclasses.replace(entry, unsupported={})
    with pytest.raises(ExportError):
        if entry.derived:
            derived.export_derived(bare, zoo.get(entry.base), exporter, tmp_path / "x.onnx")
        else:
            torch_export.export_entry(bare, exporter, tmp_path / "x.onnx")


def test_export_refuses_to_overwrite(tmp_path):
    out = tmp_path / "m.onnx"
    out.write_text("keep me")
    with pytest.raises(Exception, match="exists"):
        zoo.export("vit", "torchscript", out)
    assert out.read_text() == "keep me"


# ---------------------------------------------------------------- the entries of issue 10's classes
MISSED = class_cases()  # each entry with classes once in the fast lane, every export in the slow one
_PASS_THROUGH = {"Reshape", "Cast", "Identity", "Dropout", "QuantizeLinear", "DequantizeLinear", "Squeeze", "Unsqueeze"}


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)


class _Graph:
    """Producers, consumers and inferred shapes of one (sub)graph."""

    def __init__(self, graph: onnx.GraphProto, shapes: dict):
        self.nodes = list(graph.node)
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers = collections.defaultdict(list)
        for n in graph.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.shapes = shapes

    def softmaxes(self):
        return [n for n in self.nodes if n.op_type == "Softmax"]

    def upstream(self, tensor: str, depth: int = 6):
        """Producers along first inputs and all operands of Add/Mul/Div, `depth` steps up."""
        frontier, seen = [tensor], []
        for _ in range(depth):
            nxt = []
            for t in frontier:
                node = self.producer.get(t)
                if node is not None and node not in seen:
                    seen.append(node)
                    nxt += list(node.input) if node.op_type in ("Add", "Mul", "Div", "Where", "Sub") else node.input[:1]
            frontier = nxt
        return seen

    def product_after(self, softmax):
        """The node that multiplies the probabilities with V (through layout and Q/DQ nodes)."""
        t = softmax.output[0]
        for _ in range(6):
            users = self.consumers[t]
            products = [u for u in users if u.op_type in ("MatMul", "Einsum")]
            if products:
                return products[0], t
            passing = [u for u in users if u.op_type in _PASS_THROUGH]
            if not passing:
                return None, None
            t = passing[0].output[0]
        return None, None


def _softcap(g, sm):
    return any(n.op_type == "Tanh" for n in g.upstream(sm.input[0], 4))


def _baddbmm(g, sm):
    """alpha * Q.K^T + beta * bias on the 3-D batched product (a mask added to 4-D logits is not it)."""
    for n in g.upstream(sm.input[0], 4):
        if n.op_type == "Add" and g.shapes.get(n.output[0]) == 3:
            sources = [g.producer.get(i) for i in n.input]
            if any(p is not None and p.op_type == "Mul" and any(
                    (g.producer.get(j) is not None and g.producer[j].op_type == "MatMul") for j in p.input)
                   for p in sources):
                return True
    return False


def _layout3d(g, sm):
    product, probs = g.product_after(sm)
    return product is not None and g.shapes.get(probs) == 3


def _single_query(g, sm):
    return g.shapes.get(("dims", sm.output[0]), [None, None])[-2] == 1


def _einsum_both(g, sm):
    product, _ = g.product_after(sm)
    return product is not None and product.op_type == "Einsum" and any(
        n.op_type == "Einsum" for n in g.upstream(sm.input[0], 4))


def _qdq(g, sm):
    product, _ = g.product_after(sm)
    return (any(u.op_type == "QuantizeLinear" for u in g.consumers[sm.output[0]])
            and product is not None and all(g.producer.get(i) is not None and g.producer[i].op_type == "DequantizeLinear"
                                            for i in product.input))


def _shape_consumer(g, sm):
    return any(u.op_type == "Shape" for t in (sm.input[0], sm.output[0]) for u in g.consumers[t])


# class -> (what must hold at a site, at every site or at one at least)
SITE_CHECKS = {"softcap": (_softcap, all), "baddbmm": (_baddbmm, all), "layout3d": (_layout3d, any),
               "single_query": (_single_query, all), "einsum": (_einsum_both, all), "qdq": (_qdq, all),
               "shape_consumer": (_shape_consumer, all)}


def _shapes(model: onnx.ModelProto) -> dict:
    """tensor -> rank and ("dims", tensor) -> static dims (None where symbolic), from ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    out = {}
    for g in _graphs(inferred.graph):
        for vi in list(g.value_info) + list(g.input) + list(g.output):
            if vi.type.tensor_type.HasField("shape"):
                dims = vi.type.tensor_type.shape.dim
                out[vi.name] = len(dims)
                out[("dims", vi.name)] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return out


def _load(path) -> onnx.ModelProto:
    from trtattn.graph import io as onnxio

    return onnxio.load(path)


@pytest.mark.parametrize("name,exporter", MISSED)
def test_entry_shows_its_classes(zoo_export, name, exporter):
    """Each class an entry claims is in its export, at its attention sites."""
    entry = zoo.get(name)
    path = zoo_export(name, exporter)
    model = _load(path)
    classes = entry.classes_for(exporter)
    ops = _ops(model.graph)
    shapes = _shapes(model) if set(classes) & {"layout3d", "single_query", "baddbmm"} else {}
    sites = [(g, sm) for graph in _graphs(model.graph) for g in [_Graph(graph, shapes)] for sm in g.softmaxes()]
    for cls in classes:
        if cls in SITE_CHECKS:
            check, quantifier = SITE_CHECKS[cls]
            assert sites and quantifier(check(g, sm) for g, sm in sites), cls
    if "control_flow" in classes:  # every site inside a branch or a body, none in the main graph
        assert ops["If"] + ops["Loop"] + ops["Scan"] >= 1
        assert not _Graph(model.graph, {}).softmaxes()
    if "flatten_softmax" in classes:  # raised to opset 13, each Softmax is wrapped in Flatten/Reshape
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) <= 12
        raised = onnx.version_converter.convert_version(model, 13)
        assert _ops(raised.graph)["Flatten"] == ops["Flatten"] + entry.expected_sites
    if "external_data" in classes:
        assert (path.parent / f"{path.name}.data").stat().st_size > 0
        bare = onnx.load(str(path), load_external_data=False)
        assert any(onnx.external_data_helper.uses_external_data(t) for t in bare.graph.initializer)
    if "dims" in classes:  # a user's export: nothing says which sizes fit
        assert "trtattn.inputs" not in {p.key for p in model.metadata_props}


def _feeds(model: onnx.ModelProto, entry, **kwargs) -> dict:
    """The inputs verification feeds (trtattn.graph.feeds), and the shapes a user gives "dims" entries."""
    from trtattn.graph.feeds import make_feeds

    return make_feeds(model, shapes=entry.user_shapes or None, **kwargs)


@pytest.mark.parametrize("name,exporter", MISSED)
def test_entry_runs_on_onnx_runtime(zoo_export, name, exporter):
    """With the inputs its metadata describes (or, for "dims" entries, the shapes a user gives)."""
    import numpy as np

    path = zoo_export(name, exporter)
    model = _load(path)
    outputs = ort_run(path, _feeds(model, zoo.get(name)))
    assert outputs and all(np.isfinite(o).all() for o in outputs if o.dtype.kind == "f")


@pytest.mark.parametrize("name,exporter,shapes", [
    ("wav2vec2", "torchscript", {"input_values": [2, 8]}),  # the default length: shorter than one receptive field
    ("led", "torchscript", {"input_ids": [2, 12], "attention_mask": [2, 12], "decoder_input_ids": [2, 5]}),
])
def test_dims_entries_fail_off_their_sizes(zoo_export, name, exporter, shapes):
    """What makes them "dims" entries: lengths the exported dims allow, which the model cannot run on."""
    from trtattn.graph.feeds import make_feeds

    path = zoo_export(name, exporter)
    with pytest.raises(Exception, match="Reshape|Conv|[Ss]hape|dimension"):
        ort_run(path, make_feeds(_load(path), shapes=shapes))


@pytest.mark.parametrize("name,exporter", [(n, x) for n in ("bert-opset12", "bert-int8", "bert-external", "bert-foreign-dims")
                                           for x in zoo.get(n).exporters])
def test_derived_bert_computes_what_bert_does(zoo_export, name, exporter):
    """The tools changed the form, not the model: the same outputs as the zoo's BERT (int8 within the
    quantization error: 8-bit activations move these random-weight outputs by up to ~30% of their range)."""
    import numpy as np

    base = zoo_export("bert", exporter)
    feeds = _feeds(_load(base), zoo.get("bert"))
    want = ort_run(base, feeds)[0]
    got = ort_run(zoo_export(name, exporter), feeds)[0]
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= (0.4 if name == "bert-int8" else 1e-5) * scale
    if name == "bert-int8":
        assert np.abs(got - want).max() > 1e-3 * scale  # int8 did happen


@pytest.mark.parametrize("exporter", zoo.EXPORTERS)
def test_merged_decoder_branches_agree(zoo_export, exporter):
    """The If's two branches are one model: the with-cache branch on an empty cache computes what the
    without-cache branch does (they share the deduplicated weights)."""
    import numpy as np

    path = zoo_export("llama-merged", exporter)
    model = _load(path)
    feeds = _feeds(model, zoo.get("llama-merged"), dims={"past": 0, "attention_mask_sequence_length": 7})
    assert feeds["use_cache_branch"].tolist() == [True] and feeds["past_key_values.0.key"].shape[2] == 0
    with_cache = ort_run(path, feeds)
    without = ort_run(path, {**feeds, "use_cache_branch": np.array([False])})
    for a, b in zip(with_cache, without):
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-4
    # the weights live once, in the outer graph, under optimum's NAME_merged_K names
    shared = list(model.graph.initializer)
    contents = {(t.data_type, tuple(t.dims), onnx.numpy_helper.to_array(t).tobytes()) for t in shared}
    assert len(shared) >= 7 * 2 and len(contents) == len(shared)
    assert all(re.search(r"_merged_\d+$", t.name) for t in shared)
