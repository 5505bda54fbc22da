"""What each rank of a tensor-parallel split holds and moves, for the writer's Llama presets (README table).

    python benchmarks/tp_cost.py [--max-cache 8192] [--ranks 1,2,4,8]

Weights (fp16), the KV cache of one sequence at --max-cache, and per generated token the ALL_REDUCEs
and the bytes each rank sends over a ring (routes/parallel/cost.py: the formula is checked against the
split trtattn finds in the writer's tiny model, tests/routes/parallel/test_parallel.py).
"""

from __future__ import annotations

import argparse

from trtattn.report import table
from trtattn.routes.parallel.cost import table_rows
from trtattn.testing.write_llama import PRESETS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-cache", type=int, default=8192)
    ap.add_argument("--ranks", default="1,2,4,8")
    args = ap.parse_args(argv)
    presets = {k: PRESETS[k] for k in ("llama3-8b", "llama3-70b")}
    rows = table_rows(presets, tuple(int(r) for r in args.ranks.split(",")), args.max_cache)
    columns = [("model", "model"), ("ranks", "GPUs"), ("weights_gib", "weights GiB/GPU"),
               ("kv_cache_gib", f"KV GiB/GPU/seq @{args.max_cache}"), ("all_reduces", "ALL_REDUCE/token"),
               ("reduce_kib_per_token", "reduced KiB/token"), ("gather_kib_per_token", "gathered KiB/token"),
               ("sent_kib_per_token", "sent KiB/token/GPU")]
    print(table(rows, columns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
