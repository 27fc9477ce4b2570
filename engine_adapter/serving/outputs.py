"""A sequence's output: its detokenized text, its stop conditions, and what it emits to its caller.

The scheduler samples a token and calls `append_text`, which adds the token's text and says
whether the sequence is done ("stop": an eos token or a stop string; "length": `max_tokens`);
a running sequence then hands out a `RequestOutput` delta (`emit_delta`), a finished one its
last delta with the finish reason (`emit_final`). Deltas hold back text that could still become
the start of a stop string, so a caller never sees part of one.

Imports: the scheduler's records and the tokenizer only.
"""

from __future__ import annotations

from collections.abc import Set

from engine_adapter.model.tokenizer import Tokenizer
from engine_adapter.serving.sequence import RequestOutput, Sequence

__all__ = ["append_text", "emit_delta", "emit_final"]


def append_text(seq: Sequence, token: int, eos_ids: Set[int], tokenizer: Tokenizer) -> str | None:
    """Add the sampled `token`'s text to `seq`; the finish reason when the sequence is done."""
    is_eos = token in eos_ids and not seq.sampling.ignore_eos
    if not is_eos:
        seq.text += seq.detokenizer.push(token)
    stops = seq.sampling.stop
    if stops:
        # Only the tail can hold a stop string that the last token completed.
        window = max(len(s) for s in stops) + 16
        start = max(0, len(seq.text) - window - len(tokenizer.decode([token])))
        for stop in stops:
            pos = seq.text.find(stop, max(0, start - len(stop)))
            if pos != -1:
                seq.text = seq.text[:pos]
                return "stop"
    if is_eos:
        seq.text += seq.detokenizer.flush()
        return "stop"
    if len(seq.output_ids) >= seq.sampling.max_tokens:
        seq.text += seq.detokenizer.flush()
        return "length"
    return None


def emit_delta(seq: Sequence) -> None:
    """Hand the caller the text and tokens `seq` produced since its last delta."""
    # Hold back text that could still become the start of a stop string.
    hold = max((len(s) for s in seq.sampling.stop), default=1) - 1
    upto = max(seq.emitted_chars, len(seq.text) - hold)
    delta = seq.text[seq.emitted_chars : upto]
    seq.emitted_chars = upto
    new_tokens = seq.output_ids[seq.emitted_tokens :]
    seq.emitted_tokens = len(seq.output_ids)
    seq.emit(
        RequestOutput(
            request_id=seq.request_id,
            text=delta,
            token_ids=new_tokens,
            finished=False,
            prompt_tokens=len(seq.prompt_ids),
            cached_tokens=seq.cached_tokens or 0,
            completion_tokens=len(seq.output_ids),
            compressed_cached_tokens=seq.compressed_cached_tokens,
            written_tokens=seq.cache_receipt.written_tokens,
            written_short_tokens=seq.cache_receipt.written_short_tokens,
            retention_ttl_s=seq.cache_receipt.retention_ttl_s,
        )
    )


def emit_final(seq: Sequence) -> None:
    """Hand the caller the last delta of the finished `seq`, with its finish reason and error."""
    delta = seq.text[seq.emitted_chars :]
    seq.emitted_chars = len(seq.text)
    # the token that ended it (stop, length) was sampled but not yet handed out
    new_tokens = seq.output_ids[seq.emitted_tokens :]
    seq.emitted_tokens = len(seq.output_ids)
    seq.emit(
        RequestOutput(
            request_id=seq.request_id,
            text=delta,
            token_ids=new_tokens,
            finished=True,
            finish_reason=seq.finish_reason,
            error=seq.error,
            prompt_tokens=len(seq.prompt_ids),
            cached_tokens=seq.cached_tokens or 0,
            completion_tokens=len(seq.output_ids),
            compressed_cached_tokens=seq.compressed_cached_tokens,
            written_tokens=seq.cache_receipt.written_tokens,
            written_short_tokens=seq.cache_receipt.written_short_tokens,
            retention_ttl_s=seq.cache_receipt.retention_ttl_s,
        )
    )
