"""graph/dim_facts.py: the head size by an attention op's contract, the one rule op_dims and group_query read."""

from trtattn.graph.dim_facts import head_size_by_contract


def test_the_query_width_over_its_heads_packed_or_not():
    assert head_size_by_contract(64, None, 4, 2, packed=False) == (16, "its query width 64 over 4 heads")
    assert head_size_by_contract(128, None, 4, 2, packed=True) == (
        16, "its packed QKV width 128 over (4 + 2 * 2) heads")


def test_the_key_width_where_the_query_does_not_tell_it():
    assert head_size_by_contract(None, 32, 4, 2, packed=False) == (16, "its key width 32 over 2 key/value heads")
    assert head_size_by_contract(63, 32, 4, 2, packed=False)[0] == 16  # 63 over 4 heads is no head size


def test_no_head_size_without_a_width_that_divides_or_without_heads():
    assert head_size_by_contract(None, None, 4, 2, packed=False) == (None, "")
    assert head_size_by_contract(63, 33, 4, 2, packed=False) == (None, "")
    assert head_size_by_contract(64, 32, None, 2, packed=False) == (None, "")
