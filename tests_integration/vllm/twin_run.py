"""Token-level chats through vLLM offline: `python twin_run.py MODEL_DIR SPEC_JSON OUT_JSON`.

SPEC_JSON: {"script": `chat_script` kwargs, "pools": [num_gpu_blocks, ...], "modes": ["one",
"all"], "max_num_seqs": S, "max_num_batched_tokens": T, "async_scheduling": true for vLLM's default}.
For each pool size one engine runs the modes in turn, with `reset_prefix_cache` between them
(the twin replays the same sequence on one pool): "one" sends the requests one at a time, each
prompt built from the answers vLLM gave before; "all" sends every request in one `generate`
call, the prompts built from the answers of the last "one" run. Writes, per run, each
request's prompt, output tokens and `num_cached_tokens`, and vLLM's counters over the run
(preemptions, prefix-cache hits).
With SAGE_VLLM_GPU_POLICY set, the sage policy evicts inside vLLM.
"""

from __future__ import annotations

import gc
import json
import sys
from typing import Any

_COUNTERS = ("vllm:num_preemptions", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries")


def counters(llm: Any) -> dict[str, float]:
    return {m.name: float(getattr(m, "value", 0.0)) for m in llm.get_metrics() if m.name in _COUNTERS}


def run_mode(llm: Any, script: Any, mode: str, answers: list[list[int]] | None) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=script.output_len, ignore_eos=True)
    before = counters(llm)
    if mode == "one":
        prompts, outputs, cached = [], [], []
        for i in range(len(script.turns)):
            prompt = list(script.prompts([*outputs, *[[]] * (len(script.turns) - i)])[i])
            (result,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
            prompts.append(prompt)
            outputs.append(list(result.outputs[0].token_ids))
            cached.append(int(result.num_cached_tokens or 0))
    else:
        assert answers is not None, "mode 'all' builds its prompts from a 'one' run's answers"
        prompts = [list(p) for p in script.prompts(answers)]
        results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outputs = [list(r.outputs[0].token_ids) for r in results]
        cached = [int(r.num_cached_tokens or 0) for r in results]
    after = counters(llm)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in _COUNTERS}
    return {
        "mode": mode,
        "prompts": prompts,
        "outputs": outputs,
        "num_cached_tokens": cached,
        "counters": delta,
    }


def main() -> None:
    model, spec_path, out = sys.argv[1:4]
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    import vllm
    from vllm import LLM

    from engine_adapter.sim.twins.chats import chat_script

    script = chat_script(**spec["script"])
    runs = []
    for pool in spec["pools"]:
        llm = LLM(
            model=model,
            dtype="float32",  # this CPU has no bf16 instructions: float32 runs several times faster
            max_model_len=640,  # the longest prompt and its answer; at most (num_gpu_blocks - 1) * 32
            enable_prefix_caching=True,
            enforce_eager=True,
            block_size=32,
            num_gpu_blocks_override=pool,
            max_num_seqs=spec["max_num_seqs"],
            max_num_batched_tokens=spec["max_num_batched_tokens"],
            seed=0,
            disable_log_stats=False,
            # The twin steps as the synchronous scheduler does. Left to vLLM (its default picks
            # async scheduling where the executor supports it) the hits came out the same in every
            # run measured; the spec can ask for it (benchmarks/fidelity.py --async-scheduling).
            async_scheduling=None if spec.get("async_scheduling") else False,
        )
        answers = None
        for i, mode in enumerate(spec["modes"]):
            if i:
                assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache"
            run = run_mode(llm, script, mode, answers)
            answers = run["outputs"] if mode == "one" else answers
            runs.append({"num_gpu_blocks": pool, **run})
        del llm
        gc.collect()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"spec": spec, "runs": runs, "vllm": vllm.__version__}, f)


if __name__ == "__main__":
    main()
