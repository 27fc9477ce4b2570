"""Request intake: what a completion or embedding request is checked against before it is queued.

`RequestIntake` turns a caller's prompt, messages or embedding inputs into token ids and
refuses, with a `RequestError` the caller sees as a 400, what the engine could never serve: an
empty prompt, token ids outside the vocabulary, a prompt plus ``max_tokens`` beyond the pool or
the model's context, or beyond its class's part of a static colocation partition (which is
hard: `engine_adapter.serving.colocation`). It also gives a sequence its SLOs (its own, else
its tenant's defaults) and the deadline they set, and an unseeded sampled request the engine's
seed. It runs in the caller's thread and reads only what does not change while the engine
serves (the config, the tokenizer, the pool's size, the static partition), and the token
policy's name.

Imports: the model's tokenizer and chat template, the cache manager (its size and clock),
token-level eviction's manager, the colocation quota's record, and this package's config,
records and errors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.text_marks import TextMarks, text_marks
from engine_adapter.colocation import Quota
from engine_adapter.model.chat_template import ChatMessage, ChatTemplateError, render_chat
from engine_adapter.model.config import ModelConfig
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.model.tokenizer import Tokenizer
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.embedding_batch import EmbeddingText
from engine_adapter.serving.errors import RequestError
from engine_adapter.serving.sequence import Sequence
from engine_adapter.token_eviction.pressure import TokenCacheManager

__all__ = ["RequestIntake", "TokenisedPrompt"]


@dataclass(frozen=True, slots=True)
class TokenisedPrompt:
    """A prompt's token ids and, when it came as text, its text marks (the request receipts tell
    a text that tokenised differently from them: `engine_adapter.cache.text_marks`)."""

    ids: list[int]
    marks: TextMarks | None = None


class RequestIntake:
    """Checks requests against the model and the pool and prepares them for the scheduler.

    Args:
        config: The engine's config (its seed, SLO defaults, colocation mode, model name).
        tokenizer: The served model's tokenizer.
        model_config: The served model's config (vocabulary size, context length).
        cache: The cache manager (the pool's size, the cache's clock for deadlines).
        token_manager: Token-level eviction (with a policy a sequence may outgrow the pool).
        partition: A static colocation partition (``static:F``), each class's hard limit;
            None otherwise.
    """

    def __init__(
        self,
        config: EngineConfig,
        tokenizer: Tokenizer,
        model_config: ModelConfig,
        cache: CacheManager,
        token_manager: TokenCacheManager,
        partition: Quota | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.cache = cache
        self.token_manager = token_manager
        self.partition = partition

    # ---- completions ---------------------------------------------------------------------------

    def tokenise(self, text: str, *, add_special_tokens: bool = True) -> TokenisedPrompt:
        """`text`'s token ids and text marks."""
        ids, ends = self.tokenizer.encode_offsets(text, add_special_tokens=add_special_tokens)
        return TokenisedPrompt(ids, text_marks(text, ids, ends))

    def prompt_ids(
        self, prompt: str | list[int] | TokenisedPrompt, sampling: SamplingParams
    ) -> TokenisedPrompt:
        """The prompt's token ids (and text marks, given text), checked: not empty, in the
        vocabulary, and with ``max_tokens`` within the pool (only the prompt with a token
        policy) and the model's context.

        Raises:
            RequestError: What the engine could never serve; the message says why.
        """
        marks = None
        if isinstance(prompt, TokenisedPrompt):  # a rendered chat, tokenised already
            ids, marks = prompt.ids, prompt.marks
        elif isinstance(prompt, str):
            if not prompt:
                raise RequestError("prompt is empty")
            tokenised = self.tokenise(prompt)
            ids, marks = tokenised.ids, tokenised.marks
        else:
            ids = [int(t) for t in prompt]
            vocab = self.model_config.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if not ids:
            raise RequestError("prompt is empty")
        self._check_room(ids, sampling)
        return TokenisedPrompt(ids, marks)

    def rest_of_context(self, prompt_tokens: int) -> int:
        """The most tokens a prompt of `prompt_tokens` leaves room to generate: the rest of the
        model's context and, unless a token policy shrinks sequences as they grow, of the pool and
        of a static partition's LLM part (what `prompt_ids` checks). A chat request without
        ``max_tokens`` gets this, as OpenAI's and vLLM's do. At least 1: a prompt that fills the
        room is refused by `prompt_ids`, which says why.
        """
        room = self.model_config.max_position_embeddings
        if self.token_manager.policy.name() == "none":
            room = min(room, self.cache.num_blocks * self.cache.block_size)
            if self.partition is not None:
                room = min(room, self.partition.llm_blocks * self.cache.block_size)
        return max(room - prompt_tokens, 1)

    def _check_room(self, ids: list[int], sampling: SamplingParams) -> None:
        total = len(ids) + sampling.max_tokens
        max_tokens_in_pool = self.cache.num_blocks * self.cache.block_size
        # With a token policy a sequence shrinks as it grows: only its prompt must fit the pool.
        compresses = self.token_manager.policy.name() != "none"
        if (len(ids) + 1 if compresses else total) > max_tokens_in_pool:
            raise RequestError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the KV pool "
                f"({self.cache.num_blocks} blocks of {self.cache.block_size} tokens = {max_tokens_in_pool})"
            )
        if self.partition is not None:
            self._check_partition(len(ids) + 1 if compresses else total, ids, sampling)
        limit = self.model_config.max_position_embeddings
        if total > limit:
            raise RequestError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the model's "
                f"context of {limit} tokens"
            )

    def _check_partition(self, tokens: int, ids: list[int], sampling: SamplingParams) -> None:
        """A static partition is hard: a request whose blocks exceed the LLM part never runs."""
        assert self.partition is not None
        size = self.cache.block_size
        need, part = -(-tokens // size), self.partition.llm_blocks
        if need > part:
            raise RequestError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({sampling.max_tokens}) needs {need} blocks; "
                f"the LLM part of the static partition ({self.config.colocation}) holds {part}"
            )

    def seeded(self, sampling: SamplingParams, seq_id: int) -> SamplingParams:
        """`sampling`, with a seed from the engine's when it samples and has none."""
        if sampling.seed is None and not sampling.greedy:
            # The engine's seed makes an unseeded sampled request reproducible, as vLLM's --seed does.
            return dataclasses.replace(sampling, seed=self.config.seed * 1_000_003 + seq_id)
        return sampling

    def set_slo(self, seq: Sequence, ttft_ms: float | None, tpot_ms: float | None) -> None:
        """The request's SLOs (its own, else its tenant's defaults) and, when it gave one or
        colocation is on, the deadline its blocks carry for the `slo` policy: the time by which
        it would finish if it met both (arrival + TTFT + TPOT for each further token). With
        colocation off and no SLO given, no deadline: the engine behaves as before SLOs."""
        defaults = self.config.slos_for(seq.tenant)
        seq.slo_ttft_ms = ttft_ms if ttft_ms is not None else defaults["ttft_ms"]
        seq.slo_tpot_ms = tpot_ms if tpot_ms is not None else defaults["tpot_ms"]
        if ttft_ms is not None or tpot_ms is not None or self.config.colocation != "off":
            budget_ms = seq.slo_ttft_ms + seq.slo_tpot_ms * max(seq.sampling.max_tokens - 1, 0)
            seq.deadline = self.cache.clock() + budget_ms / 1e3

    def chat_prompt(self, messages: list[ChatMessage], *, add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids of a conversation, rendered with the model's chat template.

        Without the generation prompt it renders a conversation's prefix, whose tokens locate a
        prompt-cache breakpoint in the whole prompt (`engine_adapter.serving.prompt_cache`).

        Raises:
            RequestError: The model has no chat template, or the template refused the messages.
        """
        # The rendered text holds its special tokens already.
        return self.tokenizer.encode(self._render(messages, add_generation_prompt), add_special_tokens=False)

    def chat_tokenised(self, messages: list[ChatMessage]) -> TokenisedPrompt:
        """A conversation's prompt (`chat_prompt`, with the generation prompt) and its text marks.

        Raises:
            RequestError: The model has no chat template, or the template refused the messages.
        """
        return self.tokenise(self._render(messages, True), add_special_tokens=False)

    def _render(self, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
        template = self.tokenizer.chat_template
        if template is None:
            raise RequestError(
                f"model {self.config.model!r} has no chat template; send a prompt to /v1/completions"
            )
        tokenizer = self.tokenizer
        try:
            text = render_chat(
                template,
                messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=tokenizer.token_text(tokenizer.bos_token_id),
                eos_token=tokenizer.token_text(tokenizer.eos_token_id),
            )
        except ChatTemplateError as exc:
            raise RequestError(str(exc)) from exc
        return text

    # ---- embeddings ----------------------------------------------------------------------------

    def embedding_texts(self, inputs: list[str | list[int]]) -> list[EmbeddingText]:
        """The inputs as the scheduler runs them, each checked: not empty, in the vocabulary,
        within the model's context and the pool.

        Raises:
            RequestError: What the engine could never serve; the message names the input.
        """
        if not inputs:
            raise RequestError("input is empty")
        texts: list[EmbeddingText] = []
        limit = min(self.model_config.max_position_embeddings, self.cache.num_blocks * self.cache.block_size)
        vocab = self.model_config.vocab_size
        for i, item in enumerate(inputs):
            ids = self.tokenizer.encode(item) if isinstance(item, str) else [int(t) for t in item]
            if not ids:
                raise RequestError(f"input {i} is empty")
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"input {i}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
            if len(ids) > limit:
                raise RequestError(
                    f"input {i} has {len(ids)} tokens; at most {limit} fit the model's context and the pool"
                )
            need = -(-len(ids) // self.cache.block_size)
            if self.partition is not None and need > self.partition.embedding_blocks:
                raise RequestError(
                    f"input {i} needs {need} blocks; the embedding part of the static partition "
                    f"({self.config.colocation}) holds {self.partition.embedding_blocks}"
                )
            texts.append(EmbeddingText(ids=ids))
        return texts
