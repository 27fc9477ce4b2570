"""Benchmark the LRU-2 plugin beside LRU and S3-FIFO on the Mooncake conversation trace.

    pip install -e examples/custom_policy      # registers `lru2` (entry point)
    python examples/custom_policy/benchmark.py [--requests N]

The same comparison from the shell: ``sage llm benchmark --trace mooncake:conversation
--eviction-policies lru,s3fifo,lru2 --capacity-ratio 0.05,0.1``.
"""

import argparse

from engine_adapter.sim import Trace, simulate
from sage_eviction import available_policies

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--requests", type=int, default=None, help="the trace's first N requests (default: all)")
args = parser.parse_args()
if "lru2" not in available_policies():
    raise SystemExit("lru2 is not registered: pip install -e examples/custom_policy first")

results = simulate(
    Trace.shipped("mooncake:conversation", requests=args.requests),
    policies=["lru", "s3fifo", "lru2"],
    capacity_ratios=[0.05, 0.10],
    jobs=None,
)
print(results.to_pandas()[["policy", "capacity_blocks", "hit_rate", "evictions"]].to_string(index=False))
