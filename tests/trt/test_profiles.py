"""trtattn/trt/profiles.py: the engine's optimisation profiles, read from the model."""

import onnx

from trtattn.trt import profiles


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def test_position_table_with_an_offset_limits_the_positions(zoo_export):
    """profiles.py:104 (rows - offset): BART indexes its learned table at position + 2, so a table of
    max_position_embeddings + 2 = 66 rows takes 64 positions (68 with the sign flipped)."""
    model = onnx.load(str(zoo_export("bart", "torchscript")), load_external_data=False)
    rows = {int(t.dims[0]) for t in model.graph.initializer if len(t.dims) == 2 and "embed_positions" in t.name}
    want = 64  # zoo/models.py bart_config: max_position_embeddings=64
    assert rows == {want + 2}, rows
    assert profiles.max_positions(model) == (want, "its learned position table")
