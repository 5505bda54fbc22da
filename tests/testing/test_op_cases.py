"""trtattn/testing/op_cases.py: onnx's backend cases of the Attention op and their outcomes."""

from trtattn.testing.op_cases import CaseOutcome


# Survivors of mutating match/ and testing/ (benchmarks/mutate.py, seed 20261128): each test fails when the line its
# docstring names is mutated.
def test_case_outcome_matches_reference_is_false_over_the_bound():
    """testing/op_cases.py:45: matches_reference is a property, false when an error exceeds its bound."""
    assert not CaseOutcome("c", "f", reference_error={"y": 0.5}, reference_bound={"y": 0.1}).matches_reference
    assert not CaseOutcome("c", "f").matches_reference  # nothing compared: no match
    assert CaseOutcome("c", "f", reference_error={"y": 0.01}, reference_bound={"y": 0.1}).matches_reference is True
