"""The traces shipped inside the package (issue 28, items 14 and 15): they are the published data,
they are read by name from a clone or an installed wheel, gzipped traces read as plain ones, and
a line too long to be a trace is refused without being read into memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fresh_copy import fresh_copy

from engine_adapter.sim.azure_trace import read_azure
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.shipped_traces import SHIPPED_TRACES, is_trace_name, shipped_trace, trace_names
from engine_adapter.sim.trace_file import MAX_LINE_BYTES, TraceLines, WorkloadError

# sha256 of the uncompressed files as published upstream (engine_adapter/sim/traces/README.md).
PUBLISHED_SHA256 = {
    "mooncake:conversation": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    "mooncake:synthetic": "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
    "azure:code": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    "azure:conversation": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
}
LICENCE_FILES = {"Apache-2.0": "LICENSE-APACHE.txt", "CC-BY-4.0": "LICENSE-CC-BY-4.0.txt"}


@pytest.mark.parametrize("name", sorted(SHIPPED_TRACES))
def test_every_shipped_trace_is_the_published_data_with_its_licence(name: str) -> None:
    path, trace = shipped_trace(name)
    assert path.suffix == ".gz" and path.stat().st_size < 1_000_000  # the package stays small
    assert hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() == PUBLISHED_SHA256[name]
    licence = path.parent / LICENCE_FILES[trace.licence]
    assert licence.is_file() and licence.stat().st_size > 1000
    read = read_mooncake if trace.trace_format == "mooncake" else read_azure
    workload = read(path)
    assert len(workload.requests) == trace.requests
    assert workload.sha256 == PUBLISHED_SHA256[name]  # what a benchmark's JSON records
    provenance = (path.parent.parent / "README.md").read_text(encoding="utf-8")
    assert f"`{name}`" in provenance and PUBLISHED_SHA256[name] in provenance


def test_names_are_told_from_paths_and_an_unknown_name_lists_the_shipped_ones() -> None:
    assert trace_names() == list(PUBLISHED_SHA256)
    assert all(is_trace_name(name) for name in trace_names())
    for path in ("trace.jsonl", "../shared/traces/mooncake/conversation_trace.jsonl", "c:trace.csv"):
        assert not is_trace_name(path)
    with pytest.raises(ValueError, match=r"no trace named 'mooncake:toolagent' .*mooncake:conversation"):
        shipped_trace("mooncake:toolagent")


def _lines(n: int) -> str:
    records = (
        {"timestamp": 10 * i, "input_length": 1024, "output_length": 4, "hash_ids": [1, i + 2]}
        for i in range(n)
    )
    return "".join(json.dumps(record) + "\n" for record in records)


def test_a_gzipped_trace_reads_as_the_plain_one(tmp_path: Path) -> None:
    plain = tmp_path / "t.jsonl"
    plain.write_text(_lines(20), encoding="utf-8")
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = read_mooncake(plain), read_mooncake(packed)
    assert a.requests == b.requests and a.sha256 == b.sha256
    assert read_mooncake(packed, limit=5).sha256 == a.sha256  # the rest is hashed, not parsed


def test_a_damaged_gzip_trace_is_a_one_line_error(tmp_path: Path) -> None:
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(_lines(2000).encode())[:300])
    with pytest.raises(WorkloadError, match=r"t\.jsonl\.gz: not a readable gzip file") as info:
        read_mooncake(packed)
    assert "\n" not in str(info.value)


def test_a_line_longer_than_the_limit_is_refused_after_the_limit(tmp_path: Path) -> None:
    trace = tmp_path / "long.jsonl"
    with trace.open("wb") as f:
        f.write(_lines(1).encode())
        f.write(b'{"timestamp": 0, "hash_ids": [' + b"1, " * MAX_LINE_BYTES)  # 3 MiB, no newline
    with TraceLines(trace) as lines, pytest.raises(WorkloadError) as info:
        for _ in lines:
            pass
    assert str(info.value) == (
        f"{trace}:2: line longer than {MAX_LINE_BYTES:,} bytes; a trace has one request per line"
    )
    # A line of exactly the limit, newline included, is a line.
    exact = tmp_path / "exact.jsonl"
    exact.write_bytes(b" " * (MAX_LINE_BYTES - 1) + b"\n")
    with TraceLines(exact) as lines:
        assert [len(line) for line in lines] == [MAX_LINE_BYTES]


def _peak_rss_kib(args: list[str], cwd: Path) -> tuple[int, str, int]:
    """Run `args`; its exit status, its stderr and its own peak RSS in KiB (`os.wait4`: the
    child's, not this test process's or its other children's)."""
    env = {**os.environ, "SAGE_HOME": str(cwd / "sage-home")}
    env.pop("SAGE_DEBUG", None)
    with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, stderr, usage.ru_maxrss


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_1_gb_line_without_a_newline_is_refused_in_little_memory(tmp_path: Path, suffix: str) -> None:
    """Issue 28, item 15: one 1 GB line (no newline) took 2.1 GB before it was refused. The file
    is sparse (1 GB of it reads as zeros without taking the disk), so the CLI streams it as it
    would a real one; its peak RSS must stay that of a benchmark that read nothing."""
    trace = tmp_path / f"huge{suffix}"
    with trace.open("wb") as f:
        f.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\n" if suffix == ".csv" else b"")
        f.write(b'{"timestamp": 0, "hash_ids": [' if suffix == ".jsonl" else b"2023-11-16 18:15:46,")
        f.truncate(1 << 30)
    command = [sys.executable, "-m", "sage_cli", "llm", "benchmark", "--trace", str(trace), "--jobs", "1"]
    code, stderr, peak_kib = _peak_rss_kib(command, tmp_path)
    assert code == 2, stderr
    line = 2 if suffix == ".csv" else 1
    assert stderr.strip() == (
        f"Error: {trace}:{line}: line longer than {MAX_LINE_BYTES:,} bytes; a trace has one request per line"
    )
    # The same command on a file whose first request is malformed: the same imports and the
    # same error path, having read a few bytes.
    small = tmp_path / f"small{suffix}"
    small.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,1\n" if suffix == ".csv" else b"{nope\n")
    small_command = [*command[:-3], str(small), "--jobs", "1"]
    baseline_code, baseline_err, baseline_kib = _peak_rss_kib(small_command, tmp_path)
    assert baseline_code == 2 and f"{small.name}:" in baseline_err
    assert peak_kib < baseline_kib + 16 * 1024, (peak_kib, baseline_kib)  # 1 MiB read, not 1 GiB


@pytest.mark.slow
def test_an_installed_wheel_reads_the_traces_by_name(tmp_path: Path) -> None:
    """The traces are package data: a wheel built from a clone holds them, and, installed, the
    CLI replays `mooncake:synthetic` by name from the installed package."""
    clone = fresh_copy(tmp_path / "clone")
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    env = {**os.environ, "CC": "false"}  # no compiled core: quicker, and the traces are the point
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    build += ["-w", str(wheels), "."]
    subprocess.run(build, cwd=clone, env=env, check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("sage_kv-*.whl")
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    run_env = {**os.environ, "PYTHONPATH": str(site), "SAGE_HOME": str(tmp_path / "home")}
    where = subprocess.run(
        [sys.executable, "-c", "import engine_adapter.sim.shipped_traces as t; print(t.__file__)"],
        cwd=tmp_path, env=run_env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(site))
    proc = subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "benchmark", "--trace", "mooncake:synthetic", "--requests",
         "200", "--eviction-policies", "lru", "--jobs", "1", "--json"],
        cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["workload"]["path"].startswith(str(site))
    assert result["workload"]["sha256"] == PUBLISHED_SHA256["mooncake:synthetic"]
    assert result["workload"]["requests"] == 200
