# %% [markdown]
# # Compare eviction policies on a real trace
#
# The Mooncake table of docs/benchmarks/comparing-policies.md from Python: replay its trace (shipped with
# sage) against a few policies at 5 % and 10 % of its distinct blocks, beside the unbounded
# cache and Belady, then look at the rows as a DataFrame and a plot. A jupytext "percent"
# script: run it with `python examples/compare_policies.py`, or open it as a notebook
# (`jupytext --to notebook`). `--requests N` takes the trace's first N requests (CI runs 300).
#
# Needs the `dataframes` and `plot` extras (pandas, matplotlib).

# %%
import argparse

from engine_adapter.sim import Trace, simulate

parser = argparse.ArgumentParser(description="Compare eviction policies on the Mooncake trace.")
parser.add_argument("--requests", type=int, default=None, help="the trace's first N requests (default: all)")
parser.add_argument("--policies", default="lru,s3fifo,arc,sieve", help="comma-separated policy names")
parser.add_argument("--plot", default="compare_policies.png", help="where to write the figure")
args = parser.parse_args()

# %% The five lines: a trace, a simulation, a table, a plot.
trace = Trace.shipped("mooncake:conversation", requests=args.requests)
results = simulate(trace, policies=args.policies.split(","), capacity_ratios=[0.05, 0.10], jobs=None)
table = results.to_pandas()[["policy", "capacity_blocks", "hit_rate", "ttft_p50_s", "ttft_p99_s"]]
print(table.to_string(index=False))
results.plot(args.plot)

# %% [markdown]
# Hit rate is the fraction of prompt blocks served from cache; `belady` (offline, it sees the
# future) bounds every online policy at the same size, and `unbounded` bounds them all.

# %%
best = table[~table["policy"].isin(["belady", "unbounded"])].sort_values("hit_rate").iloc[-1]
print(f"best online policy: {best['policy']} at {best['capacity_blocks']} blocks ({best['hit_rate']:.3f})")
print(f"figure: {args.plot}")
