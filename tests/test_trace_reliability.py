"""Trace readers under hostile or large input: one-line errors naming file and line, bounded memory.

- A line nested 100,000 levels deep (the whole line, or a record's `hash_ids`) is a one-line
  `WorkloadError` ``path:line: ...``, not a `RecursionError`; so is an Azure field beyond the
  CSV module's field limit.
- The readers stream: their peak memory above what the parsed workload keeps is a small part
  of the file's size (tracemalloc), and `limit` stops the parsing.
"""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from engine_adapter.sim.azure_trace import read_azure
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.workloads import Workload, WorkloadError

GOOD = '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}'
DEEP = 100_000

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_GOOD = "2023-11-16 18:17:03.9799600,4808,10"


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize(
    "bad_line",
    [
        _nested(DEEP),
        '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": ' + _nested(DEEP) + "}",
        '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2], "x": ' + "{" * DEEP,
    ],
    ids=["line", "hash_ids", "unclosed-objects"],
)
def test_a_deeply_nested_mooncake_line_is_a_one_line_error(tmp_path: Path, bad_line: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{GOOD}\n{GOOD}\n{bad_line}\n{GOOD}\n")
    with pytest.raises(WorkloadError) as caught:
        read_mooncake(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ")
    assert "\n" not in message and len(message) < 300, message


@pytest.mark.parametrize("depth", [50, 500, 900])
def test_nested_hash_ids_that_parse_are_named_briefly(tmp_path: Path, depth: int) -> None:
    # Shallow enough for json to parse, yet repr() of it would be long (or recurse too deep).
    path = tmp_path / "trace.jsonl"
    record = '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": '
    path.write_text(f"{GOOD}\n{record}[1, {_nested(depth)}]}}\n")
    with pytest.raises(WorkloadError) as caught:
        read_mooncake(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: 'hash_ids' must hold integers, found [")
    assert len(message) < 300, message


def test_an_azure_field_beyond_the_csv_limit_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    huge = "9" * 200_000
    path.write_text(f"{AZURE_HEADER}\n{AZURE_GOOD}\n2023-11-16 18:17:04.0,{huge},10\n{AZURE_GOOD}\n")
    with pytest.raises(WorkloadError) as caught:
        read_azure(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ")
    assert len(message) < 300, message


def test_mooncake_limit_stops_before_a_bad_line_and_the_digest_is_the_files(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{GOOD}\n{GOOD}\n{_nested(DEEP)}\n")
    workload = read_mooncake(path, limit=2)
    assert len(workload) == 2
    assert workload.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_mooncake_blank_lines_and_crlf_keep_their_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(f"{GOOD}\r\n\r\n{GOOD}\r\n[1]\r\n".encode())
    with pytest.raises(WorkloadError, match=r"trace.jsonl:4: expected a JSON object"):
        read_mooncake(path)
    path.write_bytes(f"{GOOD}\r\n\r\n{GOOD}\r\n".encode())
    assert len(read_mooncake(path)) == 2


# --------------------------------------------------------------------------- memory

PAD = 1400  # bytes of an ignored field per line: the file is large, the parsed requests small


def _mooncake_file(path: Path, lines: int) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i in range(lines):
            record = {
                "timestamp": i,
                "input_length": 1024,
                "output_length": 8,
                "hash_ids": [i % 97, i],
                "note": "x" * PAD,
            }
            out.write(json.dumps(record) + "\n")
    return path


def _azure_file(path: Path, rows: int) -> Path:
    with path.open("w", encoding="utf-8") as out:
        out.write(f"{AZURE_HEADER},Note\n")
        for i in range(rows):
            out.write(
                f"2023-11-16 18:{i // 6000 % 60:02d}:{i // 100 % 60:02d}.{i % 100:02d},512,4,{'x' * PAD}\n"
            )
    return path


def _peak_above_result(read: Callable[[], Workload]) -> tuple[Workload, int, int]:
    """`read()`'s workload, its peak traced bytes above what the workload keeps, and what it keeps."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        workload = read()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return workload, peak - kept, kept - before


@pytest.fixture(scope="module")
def big_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("big-traces")
    return {
        "mooncake": _mooncake_file(folder / "big.jsonl", 20_000),
        "azure": _azure_file(folder / "big.csv", 20_000),
    }


READERS: dict[str, Callable[..., Workload]] = {"mooncake": read_mooncake, "azure": read_azure}


@pytest.mark.parametrize("reader", ["mooncake", "azure"])
def test_readers_stream_the_file(big_traces: dict[str, Path], reader: str) -> None:
    path = big_traces[reader]
    size = path.stat().st_size
    assert size > 25_000_000
    workload, transient, kept = _peak_above_result(lambda: READERS[reader](path))
    assert len(workload) == 20_000
    # Reading the text whole held the bytes, the text and its lines at once: about 2x the file
    # above the result. Streaming leaves the per-row columns (Azure) and the list's slack.
    assert transient < size // 4, (transient, kept, size)
    assert kept < size // 2, (transient, kept, size)


@pytest.mark.parametrize("reader", ["mooncake", "azure"])
def test_limit_stops_parsing_and_memory_stays_flat(big_traces: dict[str, Path], reader: str) -> None:
    path = big_traces[reader]
    workload, transient, kept = _peak_above_result(lambda: READERS[reader](path, limit=10))
    assert len(workload) == 10
    assert transient + kept < 2_000_000, (transient, kept)  # the rest of the file is only hashed
    assert workload.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
