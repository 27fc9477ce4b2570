"""Token-level multi-turn chats: the workload the engine twins are proven on.

`ChatScript` is a seeded script of interleaved chats that share one system prompt: each turn
adds a user message of random tokens, and its prompt is the chat so far (the system prompt, the
earlier turns' messages and answers) followed by that message. The answers are what the engine
generates, so a prompt is only known once the turns before it have been answered:
`ChatScript.prompts(answers)` builds them from given answers (the engine's, or the seeded
stand-ins of `stand_in_answers` when no engine runs), and `token_workload(prompts, outputs)`
makes the simulator's `Workload` with each request's tokens (`SimRequest.token_ids`), so the
twins hash the blocks an engine hashes, the answer's blocks included.

Token ids are drawn from [1000, 30000): inside the vocabulary of every model the tests load.
Pure Python; imports the workload records and the twin's block hashing only.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from engine_adapter.sim.twins.vllm_pool import chained_hashes
from engine_adapter.sim.workloads import SimRequest, Workload, check_int

__all__ = ["ChatScript", "chat_script", "stand_in_answers", "token_workload"]

_LOW, _HIGH = 1000, 30000


@dataclass(frozen=True, slots=True)
class ChatScript:
    """Interleaved chats over one system prompt.

    Attributes:
        system: The shared system prompt's tokens.
        turns: (chat, user message tokens) per request, in the order they are sent.
        output_len: Tokens each answer has.
        seed: The seed the script was drawn with.
        token_range: The [low, high) its tokens are drawn from.
    """

    system: tuple[int, ...]
    turns: tuple[tuple[int, tuple[int, ...]], ...]
    output_len: int
    seed: int
    token_range: tuple[int, int] = (_LOW, _HIGH)

    def prompts(self, answers: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        """Each request's prompt, given the answer of every request (index = request)."""
        if len(answers) != len(self.turns):
            raise ValueError(f"{len(answers)} answers for {len(self.turns)} turns")
        history: dict[int, tuple[int, ...]] = {}
        out = []
        for i, (chat, message) in enumerate(self.turns):
            prompt = history.get(chat, self.system) + message
            out.append(prompt)
            history[chat] = prompt + tuple(answers[i])
        return out


def chat_script(
    *,
    requests: int = 60,
    chats: int = 6,
    system_tokens: int = 100,
    message_tokens: tuple[int, int] = (10, 60),
    max_prompt_tokens: int = 600,
    output_len: int = 8,
    seed: int = 0,
    token_range: tuple[int, int] = (_LOW, _HIGH),
) -> ChatScript:
    """A seeded script: each request continues a chat drawn uniformly; a chat whose next prompt
    would pass `max_prompt_tokens` starts over (a new chat on the same system prompt). Tokens are
    drawn from `token_range` ([low, high); a small model's vocabulary may need a lower one)."""
    checks = {"requests": requests, "chats": chats, "system_tokens": system_tokens, "output_len": output_len}
    for name, value in checks.items():
        check_int(name, value, 1)
    low, high = token_range
    if not 0 <= low < high:
        raise ValueError(f"token_range {token_range}: give 0 <= low < high")
    rng = random.Random(seed)
    system = tuple(rng.randrange(low, high) for _ in range(system_tokens))
    lengths = dict.fromkeys(range(chats), system_tokens)
    restarts = dict.fromkeys(range(chats), 0)
    turns = []
    for _ in range(requests):
        slot = rng.randrange(chats)
        message = tuple(rng.randrange(low, high) for _ in range(rng.randint(*message_tokens)))
        if lengths[slot] + len(message) > max_prompt_tokens:
            restarts[slot] += 1
            lengths[slot] = system_tokens
        turns.append((slot * 1000 + restarts[slot], message))
        lengths[slot] += len(message) + output_len
    return ChatScript(system, tuple(turns), output_len, seed, token_range)


def stand_in_answers(script: ChatScript) -> list[tuple[int, ...]]:
    """Seeded answers in place of a model's, for runs without an engine."""
    rng = random.Random(script.seed + 1)
    low, high = script.token_range
    return [tuple(rng.randrange(low, high) for _ in range(script.output_len)) for _ in script.turns]


def token_workload(
    script: ChatScript,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    *,
    block_size: int = 32,
    gap_s: float = 0.0,
) -> Workload:
    """The simulator's workload: request i sends `prompts[i]` and generates `outputs[i]`; it
    arrives `gap_s` seconds after the one before (0: all at once). Block keys are the chained
    hashes of the prompt's full blocks, the twins' and the engine's keys alike."""
    check_int("block_size", block_size, 1)
    requests = []
    for i, ((chat, _), prompt, output) in enumerate(zip(script.turns, prompts, outputs, strict=True)):
        requests.append(
            SimRequest(
                request_id=i,
                arrival_s=i * gap_s,
                block_hashes=tuple(chained_hashes(prompt, block_size)),
                input_len=len(prompt),
                output_len=len(output),
                session=f"chat{chat}",
                token_ids=tuple(prompt) + tuple(output),
            )
        )
    params = {"requests": len(requests), "seed": script.seed, "gap_s": gap_s, "output_len": script.output_len}
    return Workload(requests=requests, block_size=block_size, source="chats", params=params)
