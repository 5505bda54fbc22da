"""trtattn/match/rotation.py: rotary embeddings read by probing their cone."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from tests.conftest import ort_run
from trtattn.graph.view import GraphView
from trtattn.match.rotation import _cone_model


# Survivors of mutating match/ and testing/ (benchmarks/mutate.py, seed 20261128): each test fails when the line its
# docstring names is mutated.
def _table_graph():
    """y = a_x * t_cos with t_cos a stored table: the probe feeds both (the input sorts before the table)."""
    x = gs.Variable("a_x", np.float32, [4])
    table = gs.Constant("t_cos", np.full(4, 5.0, np.float32))
    y = gs.Variable("y", np.float32, [4])
    node = gs.Node("Mul", inputs=[x, table], outputs=[y])
    graph = gs.Graph(nodes=[node], inputs=[x], outputs=[y], opset=17)
    return GraphView(graph), node, x, table, y


def test_cone_feeds_a_stored_table_as_an_input_and_keeps_the_other_operands():
    """match/rotation.py:193 and :195: a stored table probed becomes a graph input in place of the stored value,
    in the consumer's table operand only (the other operand stays the probed x)."""
    view, node, x, table, y = _table_graph()
    feeds = {"a_x": np.arange(4, dtype=np.float32), "t_cos": np.array([1, -2, 3, -4], np.float32)}
    model = _cone_model([node], [x, table], y, feeds, view)
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["a_x", "t_cos"]
    assert [t.name for t in model.graph.initializer] == []  # the table is probed, not read from the model
    assert list(model.graph.node[0].input) == ["a_x", "t_cos"]
    np.testing.assert_allclose(ort_run(model, feeds)[0], feeds["a_x"] * feeds["t_cos"])
