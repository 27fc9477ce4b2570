"""The seeded prefix model: shared system prompts and multi-turn conversations as block keys.

`PrefixModel` gives prefix structure to sources that carry none: the Azure traces (arrival
times and lengths only, `apply_prefix_model`) and the synthetic generator
(`engine_adapter.sim.synthetic`, which drives `PrefixBuilder` turn by turn). New blocks get
fresh integer keys in order of creation, so a stream is a pure function of the seed and the
inputs.

A turn comes out as its request's fields (`Turn`), which a `RequestTable` takes as they are
(`apply_prefix_model`, `synthetic`) and a `SimRequest` is built from (`synthetic_stream`): what
is held besides the table is each open conversation's blocks (at most `sessions` of them), never
a request's keys once it is in the table.

Pure Python and numpy; imports the workload records and the request table only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.trace_file import WorkloadError
from engine_adapter.sim.workloads import check_float, check_int

__all__ = ["Conversation", "PrefixBuilder", "PrefixModel", "Turn", "apply_prefix_model"]

Turn = tuple[int, float, tuple[int, ...], int, int, "str | None", int, "str | None"]
"""A request's fields in the order `SimRequest` and `RequestTable.add` take them: request id,
arrival (s), block keys, input and output lengths, tenant, priority, session."""


def _zipf_weights(n: int, skew: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** skew
    normalised: np.ndarray = weights / weights.sum()
    return normalised


@dataclass(frozen=True, slots=True)
class PrefixModel:
    """A seeded model of shared prefixes, for sources that carry none (Azure) and `synthetic`.

    Requests belong to conversations. There are `sessions` conversation slots; each request
    picks a slot from a Zipf distribution with exponent `session_skew` (0: uniform), so a few
    conversations are hot (short reuse distances) and a long tail is cold (long ones). A slot
    holds one conversation at a time: it lasts a geometric number of turns with mean `turns`
    (1 makes every request a one-off), then the next request to that slot opens a new one with
    a new session id.

    A conversation's first turn starts, with probability `p_system`, with one of
    `system_prompts` shared system prompts (uniform) of `system_prompt_tokens` tokens, whose
    `system_prompt_tokens // block_size` blocks every such request shares. A later turn extends
    the previous prompt: it reuses the previous turn's blocks and adds new ones. Where a trace
    gives a next turn a shorter prompt (Azure's lengths are what they are), it reuses the blocks
    it has room for and the conversation keeps its longer prefix. Blocks written during decode
    are not modelled as reusable.

    Each conversation draws a tenant (uniform over `tenants`; 0 means no tenant, `None`) and a
    priority (`priority_weights[i]` is the weight of priority `i`). New blocks get fresh integer
    keys in order of creation, so the stream is a pure function of the seed and the inputs.

    Attributes:
        seed: Seed of the model's random stream.
        block_size: Tokens per block key.
        sessions: Conversation slots.
        session_skew: Zipf exponent of the slot choice (0: uniform).
        turns: Mean turns per conversation (geometric, >= 1).
        system_prompts: Distinct shared system prompts (0: none).
        system_prompt_tokens: Length of each system prompt.
        p_system: Probability that a conversation starts with a system prompt.
        tenants: Tenants `"t0"`, `"t1"`, ... (0: no tenant).
        priority_weights: Relative weights of priorities 0, 1, 2, ...
    """

    seed: int = 0
    block_size: int = 16
    sessions: int = 64
    session_skew: float = 1.0
    turns: float = 4.0
    system_prompts: int = 4
    system_prompt_tokens: int = 1024
    p_system: float = 0.8
    tenants: int = 0
    priority_weights: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0)
        check_int("block_size", self.block_size, 1)
        check_int("sessions", self.sessions, 1)
        check_float("session_skew", self.session_skew, 0.0)
        check_float("turns", self.turns, 1.0)
        check_int("system_prompts", self.system_prompts, 0)
        check_int("system_prompt_tokens", self.system_prompt_tokens, 0)
        check_float("p_system", self.p_system, 0.0, 1.0)
        check_int("tenants", self.tenants, 0)
        weights = self.priority_weights
        if (
            not isinstance(weights, tuple | list)
            or not weights
            or any(type(w) not in (int, float) or not math.isfinite(w) or w < 0 for w in weights)
            or sum(weights) <= 0
        ):
            raise WorkloadError(
                f"priority_weights must be a non-empty list of non-negative weights with a positive sum, "
                f"got {weights!r}"
            )
        object.__setattr__(self, "priority_weights", tuple(float(w) for w in weights))

    def to_dict(self) -> dict[str, Any]:
        """The parameters, JSON-serialisable."""
        params = asdict(self)
        params["priority_weights"] = list(self.priority_weights)
        return params


@dataclass(slots=True)
class Conversation:
    """One open conversation of a slot: its identity, turns left and the last turn's blocks."""

    session: str
    tenant: str | None
    priority: int
    turns_left: int
    blocks: tuple[int, ...]
    input_len: int
    output_len: int


class PrefixBuilder:
    """Runs a `PrefixModel` over a stream of requests (the Azure reader and `synthetic`).

    Per request: `slot()`; then `start()` and `first_turn()` for a new conversation, or
    `next_turn()` for an open one; then `turn()` (its fields; `SimRequest(*turn)` is its request).
    """

    def __init__(self, model: PrefixModel, n_requests: int, rng: np.random.Generator) -> None:
        self.model = model
        self.next_key = 0
        system_blocks = model.system_prompt_tokens // model.block_size
        self.system_prompts = [self.fresh(system_blocks) for _ in range(model.system_prompts)]
        n = max(n_requests, 1)
        # Everything random is drawn up front, one array per quantity, indexed by request or by
        # conversation start (at most one per request), so that each is a pure function of the seed.
        self.slot_of = rng.choice(model.sessions, size=n, p=_zipf_weights(model.sessions, model.session_skew))
        self.turns_of = rng.geometric(1.0 / model.turns, size=n)
        self.system_of = np.where(
            rng.random(size=n) < model.p_system,
            rng.integers(0, max(model.system_prompts, 1), size=n),
            -1,
        )
        self.tenant_of = rng.integers(0, max(model.tenants, 1), size=n)
        weights = np.asarray(model.priority_weights)
        self.priority_of = rng.choice(len(weights), size=n, p=weights / weights.sum())
        self.slots: dict[int, Conversation] = {}
        self.conversations = 0

    def fresh(self, n: int) -> tuple[int, ...]:
        start = self.next_key
        self.next_key += n
        return tuple(range(start, start + n))

    def slot(self, index: int) -> tuple[int, Conversation | None]:
        """The slot request `index` goes to, and its open conversation (None: start a new one)."""
        slot = int(self.slot_of[index])
        conversation = self.slots.get(slot)
        if conversation is not None and conversation.turns_left <= 0:
            conversation = None
        return slot, conversation

    def start(self, slot: int) -> tuple[Conversation, tuple[int, ...]]:
        """Open a new conversation in `slot`; returns it and its system-prompt blocks."""
        c = self.conversations
        self.conversations += 1
        model = self.model
        system = int(self.system_of[c])
        conversation = Conversation(
            session=f"s{c}",
            tenant=f"t{int(self.tenant_of[c])}" if model.tenants else None,
            priority=int(self.priority_of[c]),
            turns_left=int(self.turns_of[c]),
            blocks=(),
            input_len=0,
            output_len=0,
        )
        self.slots[slot] = conversation
        return conversation, (self.system_prompts[system] if system >= 0 and self.system_prompts else ())

    def first_turn(
        self, conversation: Conversation, system: tuple[int, ...], input_len: int
    ) -> tuple[int, ...]:
        """Blocks of a conversation's first turn: the system prompt's (as many as fit), then new ones."""
        n = input_len // self.model.block_size
        shared = system[:n]
        conversation.blocks = shared + self.fresh(n - len(shared))
        return conversation.blocks

    def next_turn(self, conversation: Conversation, input_len: int) -> tuple[int, ...]:
        """Blocks of a later turn of `input_len` tokens; the conversation keeps the longer prefix."""
        n = input_len // self.model.block_size
        previous = conversation.blocks
        if n <= len(previous):
            return previous[:n]
        conversation.blocks = previous + self.fresh(n - len(previous))
        return conversation.blocks

    def turn(
        self,
        index: int,
        arrival_s: float,
        blocks: tuple[int, ...],
        input_len: int,
        output_len: int,
        conversation: Conversation,
    ) -> Turn:
        """Count the turn against its conversation (the next request's slot depends on it) and
        give the request's fields, for a table to take without a `SimRequest` made."""
        conversation.turns_left -= 1
        conversation.input_len = input_len
        conversation.output_len = output_len
        c = conversation
        return (index, arrival_s, blocks, input_len, output_len, c.tenant, c.priority, c.session)


def apply_prefix_model(
    model: PrefixModel, arrivals: Sequence[float], input_lens: Sequence[int], output_lens: Sequence[int]
) -> RequestTable:
    """Requests with given arrivals and lengths (Azure), their prefixes drawn from `model`, in
    the order given: each request's keys go into the table as its turn is drawn, so what is held
    is the table's arrays and the open conversations' blocks, not a tuple of keys per request."""
    builder = PrefixBuilder(model, len(arrivals), np.random.default_rng(model.seed))
    table = RequestTable()
    add = table.add
    for i, (arrival_s, input_len, output_len) in enumerate(
        zip(arrivals, input_lens, output_lens, strict=True)
    ):
        slot, conversation = builder.slot(i)
        if conversation is None:
            conversation, system = builder.start(slot)
            blocks = builder.first_turn(conversation, system, input_len)
        else:
            blocks = builder.next_turn(conversation, input_len)
        add(*builder.turn(i, arrival_s, blocks, input_len, output_len, conversation))
    return table
