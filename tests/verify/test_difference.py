"""verify/difference.py: worst_error, the measure a max over outputs or feeds keeps (requant's forced errors)."""

import math

import numpy as np

from trtattn.verify.difference import worst_error


def test_a_nan_or_an_infinity_in_one_only_or_another_shape_is_an_infinite_error():
    assert worst_error([1.0, np.nan], [1.0, 2.0]) == math.inf
    assert worst_error([1.0, 2.0], [1.0, np.inf]) == math.inf
    assert worst_error([1.0, 2.0], [[1.0, 2.0]]) == math.inf
    assert max(0.0, worst_error([np.nan], [0.0])) == math.inf  # where max(0.0, nan) would keep 0.0


def test_nan_in_both_and_equal_infinities_agree():
    assert worst_error([np.nan, -np.inf, 1.0], [np.nan, -np.inf, 1.25]) == 0.25
