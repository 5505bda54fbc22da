"""trtattn/cli/values.py: the command line's numeric values, each range's edges and the refusals past them."""

import argparse

import pytest

from trtattn.cli import values


# Survivors of mutating cli/values.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
@pytest.mark.parametrize("kind,edge,value,inside,past", [
    (values.tolerance, "0", 0.0, ("0.5", 0.5), "-1e-9"),
    (values.non_negative, "0", 0, ("3", 3), "-1"),
    (values.positive, "1", 1, ("2", 2), "0"),
    (values.memory_size, "1M", 1 << 20, ("1.5G", 3 << 29), "1023K"),
])
def test_each_range_takes_its_edge_and_refuses_past_it(kind, edge, value, inside, past):
    assert kind(edge) == value and kind(inside[0]) == inside[1]
    with pytest.raises(argparse.ArgumentTypeError, match=repr(past)):
        kind(past)


@pytest.mark.parametrize("kind,word", [(values.tolerance, "number"), (values.non_negative, "integer"),
                                       (values.positive, "integer"), (values.memory_size, "memory size")])
def test_a_value_that_is_not_a_number_says_what_was_expected(kind, word):
    with pytest.raises(argparse.ArgumentTypeError, match=f"'x1' is not an? {word}"):
        kind("x1")


def test_a_bad_value_exits_2_with_one_line(capsys):
    parser = values.OneLineParser(prog="trtattn fuse")
    parser.add_argument("--atol", type=values.tolerance)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--atol", "-1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trtattn fuse: error: argument --atol: '-1'"), err
