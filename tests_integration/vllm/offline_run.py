"""One offline vLLM run on CPU: `python offline_run.py MODEL_DIR OUT_JSON`.

Run in its own process by test_offline_engine.py, once with SAGE_VLLM_GPU_POLICY unset (vLLM's
own eviction) and once with it set. The pool is tiny (12 blocks of 32 tokens) and the prompts
share a prefix and come back, so the prefix cache hits and evicts. Requests go one at a
time, so both runs schedule identically.
"""

from __future__ import annotations

import json
import sys

SYSTEM = (
    "The following are short facts about geography, written for the brochure of a small travel "
    "agency that sells trips to Europe, Africa and Asia. Each fact is one sentence long and names "
    "one concrete place. "
)
# Each fact is long enough to fill a block of its own beyond the shared prefix; some come back.
FACTS = [
    "Among all the cities of Western Europe that travellers visit in spring, the capital of France is",
    "Among all the cities of Northern Italy that travellers visit by boat, the city of canals is",
    "Among all the great rivers that cross the African continent from south to north, the longest is",
    "Among all the cities of Western Europe that travellers visit in spring, the capital of France is",
    "Among all the mountains of the Alps that climbers attempt every summer, the highest one is",
    "Among all the cities of Northern Italy that travellers visit by boat, the city of canals is",
    "Among all the deserts of the world that caravans crossed for centuries, the largest hot one is",
    "Among all the cities of Southern Europe that travellers visit for food, the capital of Italy is",
    "Among all the cities of Western Europe that travellers visit in spring, the capital of France is",
    "Among all the oceans of the planet that ships cross between the continents, the largest is",
    "Among all the mountains of the Alps that climbers attempt every summer, the highest one is",
    "Among all the cities of the Iberian peninsula that travellers visit in autumn, the capital is",
]


def main() -> None:
    model, out = sys.argv[1], sys.argv[2]
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype="bfloat16",
        max_model_len=256,
        enable_prefix_caching=True,
        enforce_eager=True,
        block_size=32,
        num_gpu_blocks_override=12,
        seed=0,
    )
    # ignore_eos: every request decodes the same number of tokens, so both runs fill the same blocks
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    texts = []
    for fact in FACTS:
        (result,) = llm.generate([SYSTEM + fact], params, use_tqdm=False)
        texts.append(result.outputs[0].text)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"texts": texts}, f)


if __name__ == "__main__":
    main()
