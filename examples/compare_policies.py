# %% [markdown]
# # Compare eviction policies on a real trace
#
# The Mooncake table of docs/benchmarks/comparing-policies.md from Python: replay its trace (shipped with
# sage) against a few policies at 5 % and 10 % of its distinct blocks, beside the unbounded
# cache and Belady, then look at the rows as a DataFrame and a plot. A jupytext "percent"
# script: run it with `python examples/compare_policies.py`, or open it as a notebook
# (`jupytext --to notebook`). `--requests N` takes the trace's first N requests (CI runs 300).
#
# Needs the `dataframes` and `plot` extras (pandas, matplotlib). The times come from the
# shipped cost model `h100-llama-1b` (a 1B model on one H100), which keeps up with the trace as
# recorded: under the default one (a 7B on one A100) every request queues and the TTFTs measure
# that queue (the simulator warns).

# %%
import argparse
import importlib.util
import sys

# Checked before the simulation, not after it: a missing extra is said in a second.
missing = [extra for module, extra in (("pandas", "dataframes"), ("matplotlib", "plot"))
           if importlib.util.find_spec(module) is None]  # fmt: skip
if missing:
    extras = ",".join(missing)
    sys.exit(f"this example needs the {extras} extra(s): pip install -e '.[{extras}]' (from a clone) "
             f"or pip install 'sage-kv[{extras}]'")  # fmt: skip

from engine_adapter.sim import Trace, simulate  # noqa: E402

parser = argparse.ArgumentParser(description="Compare eviction policies on the Mooncake trace.")
parser.add_argument("--requests", type=int, default=None, help="the trace's first N requests (default: all)")
parser.add_argument("--policies", default="lru,s3fifo,arc,sieve", help="comma-separated policy names")
parser.add_argument("--plot", default="compare_policies.png", help="where to write the figure")
args = parser.parse_args()

# %% The five lines: a trace, a simulation, a table, a plot.
trace = Trace.shipped("mooncake:conversation", requests=args.requests)
results = simulate(
    trace, policies=args.policies, capacity_ratios=[0.05, 0.10], cost_model_path="h100-llama-1b", jobs=None
)
table = results.to_pandas()[["policy", "capacity_blocks", "hit_rate", "ttft_p50_s", "ttft_p99_s"]]
print(table.to_string(index=False))
results.plot(args.plot)

# %% [markdown]
# Hit rate is the fraction of prompt blocks served from cache; `belady` (offline, it sees the
# future) bounds every online policy at the same size, and `unbounded` bounds them all.

# A policy is best at a cache size, not across sizes (a larger cache hits more whatever the
# policy): the best online policy of each size.

# %%
online = table[~table["policy"].isin(["belady", "unbounded"])]
for blocks, rows in online.groupby("capacity_blocks", sort=True):
    best = rows.sort_values("hit_rate").iloc[-1]
    print(f"best online policy at {blocks} blocks: {best['policy']} ({best['hit_rate']:.3f})")
print(f"figure: {args.plot}")
