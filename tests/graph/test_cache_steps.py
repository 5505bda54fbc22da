"""graph/cache_steps.py: a cache the graph appends to is verified at a prefill and at a decode step beside the fitted
dims, where the model runs there, and says so either way; dims the user gave stay."""

import onnx
from onnx import TensorProto, helper

from trtattn.graph.cache_steps import with_cache_steps
from trtattn.graph.dims import fit_dims


def _appending(also_return_cache: bool = False) -> onnx.ModelProto:
    """keys = Concat(cache [1, t, 4], x [1, n, 4]) along axis 1; optionally the cache returned as it came."""
    nodes = [helper.make_node("Concat", ["cache", "x"], ["keys"], axis=1)]
    outputs = [helper.make_tensor_value_info("keys", TensorProto.FLOAT, [1, None, 4])]
    if also_return_cache:
        nodes.append(helper.make_node("Identity", ["cache"], ["same"]))
        outputs.append(helper.make_tensor_value_info("same", TensorProto.FLOAT, [1, "t", 4]))
    graph = helper.make_graph(nodes, "appending", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 4]),
                                                    helper.make_tensor_value_info("cache", TensorProto.FLOAT,
                                                                                  [1, "t", 4])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_prefill_and_a_decode_step_beside_the_fit():
    model = _appending()
    fit = fit_dims(model)
    out = with_cache_steps(model, fit, {"t": "n"})
    assert [(d["n"], d["t"]) for d in out.also] == [(fit["n"], 0), (1, fit["t"])]
    assert sum("also verified at" in r for r in out.reasons) == 2
    assert not fit.also  # the fit given is not changed


def test_a_first_step_fit_decodes_over_the_prompt():
    model = _appending()
    out = with_cache_steps(model, fit_dims(model, {"n": 5, "t": 0}), {"t": "n"})
    assert [(d["n"], d["t"]) for d in out.also] == [(1, 5)]  # the prefill is the fit itself


def test_dims_the_user_gave_are_kept():
    model = _appending()
    fit = fit_dims(model, {"t": 3})
    assert with_cache_steps(model, fit, {"t": "n"}, {"t": 3}).also == []


def test_a_step_the_model_does_not_run_at_is_said():
    model = _appending(also_return_cache=True)  # at t = 0 its output 'same' is empty
    fit = fit_dims(model)
    out = with_cache_steps(model, fit, {"t": "n"})
    assert [(d["n"], d["t"]) for d in out.also] == [(1, fit["t"])]
    assert any("not verified at a prefill" in r and "'same' is empty" in r for r in out.reasons), out.reasons


def test_new_keys_no_input_names_leave_no_decode_step():
    model = _appending()
    out = with_cache_steps(model, fit_dims(model), {"t": None})
    assert [d["t"] for d in out.also] == [0]
    assert any("not verified at a decode step" in r for r in out.reasons), out.reasons
