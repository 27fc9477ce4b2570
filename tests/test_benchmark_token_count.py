"""Output tokens of the engine benchmarks come from the stream's usage, never from its chunks.

A chunk of sage's completion stream carries no token when the detokenizer holds back an
incomplete UTF-8 character (and then several at once), and the last chunk carries only the
usage; counting chunks undercounted `sage llm benchmark --mode engine`'s tokens/s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sage_cli.benchmark.replay import EngineRun, read_stream, start_temporary_engine, timed_completion
from sage_cli.client import ControlClient
from sage_cli.sse import json_chunks

# A stream as an OpenAI server sends it with include_usage: a chunk of two tokens ("Hello" is
# one, "\u00e9" the other's bytes completed), an empty finishing chunk, the usage-only chunk.
RECORDED = (
    b'data: {"choices":[{"index":0,"text":"Hello\\u00e9","finish_reason":null}],"usage":null}\n\n'
    b'data: {"choices":[{"index":0,"text":" world","finish_reason":null}],"usage":null}\n\n'
    b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,'
    b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n'
    b"data: [DONE]\n\n"
)


def _lines(body: bytes) -> Iterator[str]:
    yield from body.decode().splitlines()


def test_a_recorded_stream_counts_the_usage_tokens_not_its_chunks() -> None:
    run = EngineRun()
    read_stream(json_chunks(_lines(RECORDED)), 0.0, run)
    assert run.has_usage
    assert (run.prompt_tokens, run.completion_tokens, run.cached_tokens) == (7, 3, 4)
    assert run.text == "Hello\u00e9 world"
    assert run.ttft_s is not None and run.last_token_s is not None
    # TPOT: the time from the first token to the last over the tokens after the first
    assert run.tpot_s == [pytest.approx((run.last_token_s - run.ttft_s) / 2)]


def test_a_stream_without_usage_leaves_the_count_to_the_caller() -> None:
    body = b"".join(line + b"\n\n" for line in RECORDED.split(b"\n\n") if b'"choices":[]' not in line)
    run = EngineRun()
    read_stream(json_chunks(_lines(body)), 0.0, run)
    assert not run.has_usage and run.completion_tokens == 0 and run.tpot_s == []
    run.count_tokens(3)  # what a tokenizer counts in run.text
    assert run.completion_tokens == 3 and len(run.tpot_s) == 1


@pytest.mark.slow
def test_the_engine_benchmark_counts_what_a_real_engine_generated() -> None:
    engine = start_temporary_engine(
        {"model": "sage-tiny", "device": "cpu", "block_size": 4, "num_blocks": 256}
    )
    try:
        body = {"prompt": [1, 2, 3, 4, 5], "max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
        with ControlClient(engine.socket, timeout=60.0) as client:
            usage_body = {**body, "stream_options": {"include_usage": True}}
            chunks = list(client.stream_completion(usage_body))
            text_chunks = [c for c in chunks if any(ch.get("text") for ch in c.get("choices", []))]
            # sage-tiny's greedy bytes from this prompt: some tokens are half a character, so
            # the stream has fewer text chunks than tokens, and counting chunks would fail here.
            assert chunks[-1]["usage"]["completion_tokens"] == 12
            assert len(text_chunks) < 12, json.dumps(chunks)

            run = timed_completion(client, usage_body)
            assert run.ok and run.completion_tokens == 12 and run.prompt_tokens == 5
            assert run.ttft_s is not None and len(run.tpot_s) == 1 and run.tpot_s[0] > 0

            unasked = timed_completion(client, body)  # no include_usage: nothing to count
            assert not unasked.ok and "include_usage" in str(unasked.error)
    finally:
        engine.stop()
