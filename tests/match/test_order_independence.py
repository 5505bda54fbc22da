"""A model's sites cannot depend on the models matched before it in the same process: no cache keyed by
the id() of an object that is freed and reused, no module-level state, no mutated shared default.

The models are matched in one order, then in the reverse one: each is matched after a different history
(first with nothing before it, last with everything), and every site and skipped record must be equal."""

import os

import onnx

from tests.conftest import DATA
from trtattn.match import match
from trtattn.testing.edits import anonymous_dims

FOREIGN = str(DATA / "foreign")
BERT, SMALL = [(4, 4, 16)] * 2, [(4, 4, 8)]
EXPECTED = {  # (query heads, key/value heads, head size) of each site, as each model alone reads
    "anonymous:bert-opset11.torchscript.onnx": BERT, "bert-opset11.torchscript.onnx": BERT,
    "keras-mha.tf2onnx.onnx": SMALL, "llama.onnxslim.onnx": [(4, 2, 16)] * 2, "tf-plain.tf2onnx.onnx": SMALL,
    "paddle-mha.paddle2onnx.onnx": SMALL, "flax-mha.jax2onnx.onnx": SMALL, "bert.ort-optimizer.onnx": BERT,
    "keras-block.tf2onnx.onnx": SMALL,
}


def _load(name: str) -> onnx.ModelProto:
    if name.startswith("anonymous:"):
        return anonymous_dims(onnx.load(os.path.join(FOREIGN, name.split(":", 1)[1])))
    return onnx.load(os.path.join(FOREIGN, name))


def _described(name: str):
    result = match(_load(name))  # loaded afresh each time: the previous model's objects are freed
    return result.sites, [(s.name, s.reason) for s in result.skipped]


def test_sites_do_not_depend_on_the_models_matched_before():
    names = list(EXPECTED)
    forward = {n: _described(n) for n in names}
    backward = {n: _described(n) for n in reversed(names)}
    again = _described(names[0])  # the first model, now after all the others
    for n in names:
        for sites, skipped in (forward[n], backward[n]):
            assert [(s.q_heads, s.kv_heads, s.head_size) for s in sites] == EXPECTED[n] and not skipped, n
        assert forward[n] == backward[n], n  # every field of every site: layouts, scale, mask, names
    assert again == forward[names[0]]
