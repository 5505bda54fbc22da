"""trt/profiles.py: a GenAI folder's context length is the maximum positions (so the cache capacity), the rotary cache's
rows where nothing else says; a dim an op fixes (a cache's head size) is one value in the profiles."""

import json

import onnx

from trtattn.cli import main
from trtattn.testing.genai_graphs import GenaiSpec, genai_decoder, write_genai_folder
from trtattn.trt import profiles
from trtattn.trt.plan import TensorIO
from trtattn.trt.profiles import PlanLimits, default_profiles, max_positions


def test_context_length_of_the_config_beside_the_model(tmp_path):
    spec = GenaiSpec(layers=1, context_length=96)
    folder = write_genai_folder(tmp_path, spec)
    model = genai_decoder(spec)
    assert max_positions(model, folder / "model.onnx") == (96, "genai_config.json (context_length)")
    assert max_positions(model, folder)[0] == 96
    assert max_positions(model, tmp_path / "nowhere" / "model.onnx") == (
        96, "the rows of its attention ops' rotary cache (cos_cache)")  # was: None (the default 2048)


def test_rotary_rows_are_read_only_where_the_op_rotates():
    model = genai_decoder(GenaiSpec(layers=1, context_length=80))
    assert max_positions(model)[0] == 80
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            del node.attribute[:]
            node.attribute.extend([onnx.helper.make_attribute("num_heads", 4),
                                   onnx.helper.make_attribute("kv_num_heads", 2)])
    assert max_positions(model) == (None, "nothing in the model")


def test_fixed_dims_are_one_value_in_every_row():
    inputs = [TensorIO("past", "float32", ["batch", 2, "past", "kv_cache_dim"])]
    [profile] = default_profiles(inputs, PlanLimits(max_batch=4, max_positions=64), {"kv_cache_dim": 16, "absent": 3})
    assert profile["past"] == {"min": [1, 2, 1, 16], "opt": [2, 2, 32, 16], "max": [4, 2, 64, 16]}
    [free] = default_profiles(inputs, PlanLimits(max_batch=4, max_positions=64))
    assert free["past"]["max"] == [4, 2, 64, 64]


def test_build_dir_takes_the_context_length_as_the_cache_capacity(tmp_path, capsys):
    """Was: caches of 2048 ("the model does not say its maximum positions"); the config says 128. The plan stops
    short of TensorRT here (exit 4 without it)."""
    folder = write_genai_folder(tmp_path / "m", GenaiSpec(layers=1, context_length=128))
    code = main(["build", str(folder / "model.onnx"), "--precision", "fp32", "--out-dir", str(tmp_path / "engines"),
                 "--plan-json", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert code in (0, 4), out
    assert "positions <= 128 (from genai_config.json (context_length)), cache capacity 128" in out
    assert "profile 0: past_key_values.0.key min [1, 2, 128, 16] opt [4, 2, 128, 16] max [8, 2, 128, 16]" in out


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


def test_plan_limits_json_keeps_the_sidecars_keys():
    """The sidecar's "limits": prepare's four keys in their order (a form without a cache: null capacity); a rank
    form's plan, which takes its numbers as given, only the two it has."""
    planned = PlanLimits(8, 64, "its learned position table")
    assert json.dumps(planned.to_json()) == ('{"max_batch": 8, "max_positions": 64, "max_positions_from": '
                                             '"its learned position table", "max_cache": null}')
    assert json.dumps(PlanLimits(max_batch=8, max_positions=2048).to_json()) == \
        '{"max_positions": 2048, "max_batch": 8}'
