"""trtattn/routes/parallel/cost.py: what a tensor-parallel split costs in collectives."""

from trtattn.routes.parallel.cost import llama_costs, table_rows


# Survivors of mutating routes/parallel (benchmarks/mutate.py): each test pins an outcome the fast lane left open.
def test_cost_table_has_one_row_per_preset_and_rank_count():
    cfg = dict(hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, layers=2)
    rows = table_rows({"tiny": cfg, "other": dict(cfg, layers=4)}, ranks=(1, 2), max_cache=16)
    assert [(r["model"], r["ranks"]) for r in rows] == [("tiny", 1), ("tiny", 2), ("other", 1), ("other", 2)]
    assert rows[1]["all_reduces"] == llama_costs(cfg, 2, 16).all_reduces == 2 * 2
    assert rows[3]["all_reduces"] == 4 * 2


def test_default_gather_threshold_is_64_mib_of_lm_head():
    """An LM head of 64 MiB of weights (fp16) splits by vocabulary by default; one just under stays whole."""
    cfg = dict(hidden=4096, heads=32, kv_heads=8, ffn=1024, vocab=8192, layers=1)
    assert llama_costs(cfg, 2, 16).all_gather_bytes == 8192 * 2
    assert llama_costs(dict(cfg, vocab=8190), 2, 16).all_gather_bytes == 0
