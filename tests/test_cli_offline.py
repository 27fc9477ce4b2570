"""The `sage` CLI with no engine: real processes for help, errors and option checks; the render
functions on sample JSON; the control client's error translation (httpx.MockTransport only for
answers a live server cannot easily give).

The tests against a live engine (start, stats, set-policy, logs --follow, stop) are not here:
they need the engine process.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine_adapter.paths import pid_path
from sage_cli import errors
from sage_cli.client import (
    ControlClient,
    EngineConnectionError,
    EngineError,
    EngineNotRunning,
    EngineProtocolError,
    EngineTimeout,
)
from sage_cli.engine.status import render_status
from sage_cli.eviction.render import policies_table, render_event, render_stats, render_swap
from sage_cli.options import parse_params
from sage_cli.output import Output
from sage_cli.paths import resolve_socket

ROOT = Path(__file__).resolve().parent.parent
UTC = dt.timezone.utc

# -- running the real program -------------------------------------------------------------------------


def _console_script() -> str | None:
    return shutil.which("sage", path=str(Path(sys.executable).parent))


PROGRAMS = [pytest.param([sys.executable, "-m", "sage_cli.app"], id="python-m")]
if _console_script():
    PROGRAMS.append(pytest.param([_console_script()], id="console-script"))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Unix socket path holds at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="sg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(short_dir: Path) -> dict[str, str]:
    """The environment of a `sage` run: a private SAGE_HOME, no other SAGE_* settings, UTC."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    clean.update(SAGE_HOME=str(short_dir / "home"), TZ="UTC", PYTHONPATH=str(ROOT), COLUMNS="100")
    return clean


def sage(
    args: list[str], env: dict[str, str], program: list[str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    command = (program or [sys.executable, "-m", "sage_cli.app"]) + args
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def command_paths() -> list[list[str]]:
    from sage_cli.app import build_command

    paths: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        paths.append(path)
        for name, child in sorted((getattr(command, "commands", None) or {}).items()):
            walk(child, [*path, name])

    walk(build_command(), [])
    return paths


COMMANDS = command_paths()


def test_the_tree_has_the_commands_of_the_spec() -> None:
    names = {" ".join(p) for p in COMMANDS}
    assert {
        "llm engine start",
        "llm engine stop",
        "llm engine status",
        "llm eviction stats",
        "llm eviction logs",
        "llm eviction set-policy",
        "llm eviction policies",
        "llm benchmark",
    } <= names


@pytest.mark.slow  # every command's help as a new process
@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "sage")
def test_help(path: list[str], program: list[str], env: dict[str, str]) -> None:
    result = sage([*path, "--help"], env, program)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: sage" + "".join(" " + p for p in path)), result.stdout[:200]
    assert result.stderr == ""


def test_version_and_no_args(env: dict[str, str]) -> None:
    from sage_cli import __version__

    result = sage(["--version"], env)
    assert (result.returncode, result.stdout) == (0, f"sage {__version__}\n")
    result = sage([], env)
    assert "Usage: sage" in result.stdout + result.stderr


# -- no engine ------------------------------------------------------------------------------


LIGHT_COMMANDS = [
    ["llm", "eviction", "stats"],
    ["llm", "eviction", "stats", "--json"],
    ["llm", "eviction", "logs", "--tail", "5"],
    ["llm", "eviction", "set-policy", "arc"],
    ["llm", "engine", "status"],
]
# Issue 28: these need no engine. `policies` lists what is installed here (until then it asked
# an engine, exit 3 without one); `stop` with nothing to stop says so and exits 0 (was 3).
NO_ENGINE_COMMANDS = [
    ["llm", "eviction", "policies"],
    ["llm", "engine", "stop"],
]


@pytest.mark.parametrize("args", LIGHT_COMMANDS, ids=" ".join)
def test_no_engine_running(args: list[str], env: dict[str, str]) -> None:
    result = sage(args, env)
    socket_file = Path(env["SAGE_HOME"]) / "run" / "default.sock"
    assert_one_line_error(
        result, errors.EXIT_NO_ENGINE, f"no engine running on {socket_file}", "sage llm engine start"
    )
    assert result.stdout == ""


def test_policies_lists_the_installed_policies_without_an_engine(env: dict[str, str]) -> None:
    from sage_eviction import available_policies

    result = sage(["llm", "eviction", "policies", "--json"], env)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert [p["name"] for p in answer["policies"]] == available_policies(include_offline=True)
    assert answer["active"] is None and answer["engine"] is None
    belady = next(p for p in answer["policies"] if p["name"] == "belady")
    assert belady["offline"] is True
    slru = next(p for p in answer["policies"] if p["name"] == "slru")
    assert slru["params"] == {"protected_threshold": 2, "protected_ratio": 0.8}
    table = sage(["llm", "eviction", "policies"], {**env, "COLUMNS": "200"})
    assert table.returncode == 0 and "(simulation only)" in table.stdout
    assert "no engine running" in table.stdout


def test_stop_with_no_engine_says_so_and_succeeds(env: dict[str, str], short_dir: Path) -> None:
    socket_file = Path(env["SAGE_HOME"]) / "run" / "default.sock"
    result = sage(["llm", "engine", "stop"], env)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"No engine running on {socket_file}; nothing to stop\n"
    as_json = json.loads(sage(["llm", "engine", "stop", "--json"], env).stdout)
    assert as_json == {"status": "not_running", "socket": str(socket_file), "stale_socket": False}
    stale = short_dir / "stale-stop.sock"
    bind_and_close(stale)
    result = sage(["llm", "engine", "stop", "--socket", str(stale)], env)
    assert result.returncode == 0 and "a stale socket file" in result.stdout
    not_a_socket = short_dir / "plain.sock"
    not_a_socket.write_text("")
    assert_one_line_error(
        sage(["llm", "engine", "stop", "--socket", str(not_a_socket)], env), 3, "is not a socket"
    )


@pytest.mark.slow
def test_no_engine_on_a_named_or_given_socket(env: dict[str, str], short_dir: Path) -> None:
    result = sage(["llm", "eviction", "stats", "--name", "blue"], env)
    assert_one_line_error(result, 3, "run/blue.sock", "`sage llm engine start --name blue --detach`")
    given = short_dir / "x.sock"
    result = sage(["llm", "eviction", "stats", "--socket", str(given)], env)
    assert_one_line_error(result, 3, f"no engine running on {given}", f"--socket {given}")
    result = sage(["llm", "eviction", "stats"], {**env, "SAGE_SOCKET": str(given)})
    assert_one_line_error(result, 3, f"no engine running on {given}")
    result = sage(["llm", "eviction", "stats"], {**env, "SAGE_NAME": "green"})
    assert_one_line_error(result, 3, "run/green.sock")


def bind_and_close(path: Path) -> None:
    """Leave a socket file that nothing listens on, as a killed engine does."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


@pytest.mark.parametrize(
    "args",
    [
        ["llm", "eviction", "stats"],
        ["llm", "engine", "status"],
        ["llm", "eviction", "logs", "-f"],
    ],
    ids=" ".join,
)
def test_stale_socket_is_not_running(args: list[str], env: dict[str, str], short_dir: Path) -> None:
    stale = short_dir / "stale.sock"
    bind_and_close(stale)
    assert stale.is_socket()
    result = sage([*args, "--socket", str(stale)], env)
    assert_one_line_error(
        result, 3, f"no engine running on {stale} (stale socket file", "sage llm engine start"
    )


def test_not_a_socket(env: dict[str, str], short_dir: Path) -> None:
    path = short_dir / "file.sock"
    path.write_text("")
    result = sage(["llm", "eviction", "stats", "--socket", str(path)], env)
    assert_one_line_error(result, 3, f"{path} is not a socket")


def test_debug_shows_the_traceback(env: dict[str, str]) -> None:
    result = sage(["llm", "eviction", "stats"], {**env, "SAGE_DEBUG": "1"})
    assert result.returncode == 3
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("Error: no engine running on")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["llm", "eviction", "stats", "--socket", "/tmp/a.sock", "--name", "b"], "either --socket or --name"),
        (["llm", "eviction", "stats", "--name", "../etc"], "engine name '../etc' is not valid"),
        (["llm", "eviction", "stats", "--interval", "0"], "'--interval': 0 is not in the range x>=0.1"),
        (["llm", "eviction", "logs", "--tail", "many"], "'--tail': 'many' is not a valid integer"),
        (["llm", "eviction", "stats", "--bogus"], "No such option: --bogus"),
        (["llm", "eviction", "set-policy"], "Missing argument 'NAME'"),
        (
            ["llm", "eviction", "set-policy", "arc", "--param", "x"],
            "--param 'x' is not of the form k=v",
        ),
        (["llm", "eviction", "stats", "--socket", "/tmp"], "'--socket': Path '/tmp' is a directory"),
        (["llm", "eviction", "logs", "--file", "/nonexistent.jsonl"], "cannot read /nonexistent.jsonl"),
        (["llm", "nope"], "No such command 'nope'"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str, env: dict[str, str]) -> None:
    assert_one_line_error(sage(args, env), errors.EXIT_USAGE, needle)


# -- engine start, up to the point where it would start one --------------------------------------


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--eviction-policy", "nope"], ["unknown eviction policy 'nope'", "available:", "lru"]),
        (["--eviction-policy", "lru", "--policy-param", "x=1"], ["policy 'lru' has no param 'x'"]),
        (["--eviction-policy", "belady"], ["needs the future"]),
        (
            ["--num-blocks", "4", "--kv-cache-memory", "1GiB"],
            ["--num-blocks and --kv-cache-memory are exclusive"],
        ),
        (["--kv-cache-memory", "2XB"], ["--kv-cache-memory: size '2XB': unknown unit 'XB'"]),
        (["--device", "tpu"], ["--device: 'tpu' is not a device"]),
        (["--num-blocks", "0"], ["'--num-blocks': 0 is not in the range x>=1"]),
        (["--engine-kind", "embedding"], ["engine kind 'embedding' is not supported"]),
        (["--json"], ["--json goes with --detach"]),
        (["--config", "/nonexistent/engine.yaml"], ["cannot read config file /nonexistent/engine.yaml"]),
    ],
)
@pytest.mark.slow
def test_engine_start_rejects_bad_settings(args: list[str], needles: list[str], env: dict[str, str]) -> None:
    assert_one_line_error(sage(["llm", "engine", "start", *args], env), errors.EXIT_USAGE, *needles)


@pytest.mark.slow
def test_engine_start_names_the_bad_key_of_a_config_file(env: dict[str, str], short_dir: Path) -> None:
    config = short_dir / "engine.yaml"
    config.write_text("eviction_policy: lru\nnum_block: 3\n")
    result = sage(["llm", "engine", "start", "--config", str(config)], env)
    assert_one_line_error(result, 2, "unknown key 'num_block'; did you mean 'num_blocks'?")
    result = sage(["llm", "engine", "start"], {**env, "SAGE_CONFIG": str(config)})
    assert_one_line_error(result, 2, "unknown key 'num_block'")
    result = sage(["llm", "engine", "start"], {**env, "SAGE_NUM_BLOCKS": "abc"})
    assert_one_line_error(result, 2, "environment: SAGE_NUM_BLOCKS: 'abc' is not an integer")


def billion_laughs(levels: int = 10) -> str:
    """YAML whose aliases expand to 10**levels list items (a few hundred bytes of text)."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("key", ["num_blocks", "policy_params"])
def test_engine_start_refuses_a_yaml_bomb_at_once(env: dict[str, str], short_dir: Path, key: str) -> None:
    # Regression: a billion-laughs value ran past 90 s and gigabytes, then printed the whole value.
    config = short_dir / "bomb.yaml"
    bomb = billion_laughs()
    config.write_text(
        bomb.replace("a9: &a9", f"{key}: &a9") if key == "num_blocks" else bomb + f"{key}: {{x: *a9}}\n"
    )
    result = sage(["llm", "engine", "start", "--config", str(config)], env, timeout=20)
    line = assert_one_line_error(result, 2, "not valid YAML", "is not allowed", "line 1")
    assert len(line) < 300


# -- benchmark option checks ------------------------------------------------------------------------


@pytest.fixture
def files(short_dir: Path) -> dict[str, Path]:
    trace = short_dir / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n')
    costs = short_dir / "costs.yaml"
    costs.write_text("- not\n- a mapping\n")
    odd = short_dir / "trace.txt"
    odd.write_text("")
    return {"trace": trace, "costs": costs, "odd": odd, "dir": short_dir}


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--eviction-policies", "lru,foo"], ["unknown eviction policy 'foo'", "available:", "arc", "lru"]),
        (["--eviction-policies", ","], ["--eviction-policies is empty"]),
        (["--capacity-blocks", "0"], ["--capacity-blocks: '0' is not a positive number of blocks"]),
        (["--capacity-blocks", "10,x"], ["--capacity-blocks: 'x' is not a positive number of blocks"]),
        (["--capacity-blocks", "10,"], ["--capacity-blocks '10,': give a comma-separated list"]),
        (["--capacity-ratio", "1.5"], ["--capacity-ratio: '1.5' is not a ratio in (0, 1]"]),
        (["--capacity-ratio", "0"], ["--capacity-ratio: '0' is not a ratio in (0, 1]"]),
        (
            ["--capacity-ratio", "0.1", "--capacity-blocks", "10"],
            ["either --capacity-blocks or --capacity-ratio"],
        ),
        (["--trace", "/nonexistent.jsonl"], ["--trace /nonexistent.jsonl: cannot read it: No such file"]),
        (["--trace", "{dir}"], ["is a directory"]),
        (["--trace", "{odd}"], ["cannot tell its format from the name; give --trace-format"]),
        (["--trace", "{trace}", "--workload", "spec"], ["either --trace or --workload"]),
        (["--trace", "{trace}", "--tenants", "3"], ["--tenants applies to a generated --workload"]),
        (["--trace-format", "azure"], ["--trace-format goes with --trace"]),
        (["--trace-format", "parquet"], ["'--trace-format'"]),
        (["--mode", "fast"], ["'--mode'"]),
        (["--cache-model", "tree"], ["'--cache-model'"]),
        (["--requests", "0"], ["'--requests': 0 is not in the range x>=1"]),
        (["--duration", "0"], ["--duration 0: give a positive number of seconds"]),
        (["--cost-model", "/nonexistent.yaml"], ["--cost-model /nonexistent.yaml: cannot read it"]),
        (["--cost-model", "{costs}"], ["the top level is not a mapping"]),
        (["--output", "/nonexistent/dir/r.json"], ["the folder /nonexistent/dir does not exist"]),
        (
            ["--eviction-policies", "belady", "--mode", "engine"],
            ["runs only in simulation (sage llm benchmark --mode sim)"],
        ),
    ],
)
@pytest.mark.slow
def test_benchmark_option_checks(
    args: list[str], needles: list[str], env: dict[str, str], files: dict[str, Path]
) -> None:
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    assert_one_line_error(sage(["llm", "benchmark", *args], env), errors.EXIT_USAGE, *needles)


# -- what the light commands import --------------------------------------------------------------------

_IMPORT_PROBE = textwrap.dedent(
    """
    import json, sys
    from sage_cli.app import main
    code = main(json.loads(sys.argv[1]))
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "engine_adapter", "sage_eviction",
                                                             "numpy", "pydantic"})
    engine = sorted(m for m in sys.modules if m.split(".")[0] == "engine_adapter")
    print(json.dumps({"code": code, "heavy": heavy, "engine": engine}))
    """
)


@pytest.mark.parametrize("args", LIGHT_COMMANDS + NO_ENGINE_COMMANDS, ids=" ".join)
def test_light_commands_import_no_engine(args: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    heavy = set(probe["heavy"])
    if args in NO_ENGINE_COMMANDS:
        assert probe["code"] == errors.EXIT_OK
        # `policies` reads the registry: the policy library (pure Python), nothing heavier.
        light = {"sage_eviction"} if args[-1] == "policies" else set()
        assert not heavy - light - {"pydantic", "engine_adapter"}, heavy  # engine: paths only, below
    else:
        assert probe["code"] == errors.EXIT_NO_ENGINE
    assert not heavy & {"torch", "numpy"}, heavy
    if args[-1] != "policies":
        assert "sage_eviction" not in heavy, heavy
    # Of the engine, only where its files live (standard library only; tests/test_import_graph.py).
    assert set(probe["engine"]) <= {"engine_adapter", "engine_adapter.paths"}, probe["engine"]
    from sage_cli._params import install_plain_conversion
    from sage_cli.app import build_command

    if install_plain_conversion(build_command()):  # Typer offers the hook: no pydantic either
        assert "pydantic" not in heavy


# -- logs from a file (no engine) ------------------------------------------------------------------

EVENTS: list[dict[str, Any]] = [
    {
        "event": "evict",
        "ts": 1767348932.0,
        "block": "3fa2b9c0d1e2f3a4",
        "block_id": 4,
        "sequence_id": 123,
        "tenant": None,
        "policy": "lru",
        "reason": "alloc",
        "last_access": 1735797332.1,
        "hits": 2,
        "priority": 0,
    },
    {
        "event": "evict",
        "ts": 1767348932.5,
        "block": "3fa2b9c0d1e2f3a4",
        "block_id": 5,
        "sequence_id": None,
        "tenant": "a",
        "policy": "lru",
        "reason": "alloc",
        "last_access": 1735797332.1,
        "hits": 0,
        "priority": 0,
    },
    {
        "event": "freed",
        "ts": 1767348933.0,
        "policy": "lru",
        "reason": "alloc",
        "blocks_freed": 10,
        "total_freed": 127,
        "duration_us": 80.0,
    },
]
RENDERED = [
    "[2026-01-02 10:15:32] EVICTION: Sequence 123 evicted (LRU, last_access=1735797332.1)",
    "[2026-01-02 10:15:32] EVICTION: Block 3fa2b9c0... evicted (LRU, last_access=1735797332.1)",
    "[2026-01-02 10:15:33] EVICTION: Freed 10 blocks, total freed: 127 blocks",
]


# The text log: one line per eviction call (issue 28; it was one line per event, RENDERED).
ONE_LINE = (
    "[2026-01-02 10:15:32] EVICTION: {victims} evicted (LRU, alloc, last_access=1735797332.1); "
    "freed 10 blocks, total freed: 127 blocks"
)


def test_logs_from_a_file(env: dict[str, str], short_dir: Path) -> None:
    log = short_dir / "evictions.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in EVENTS) + "\n")
    result = sage(["llm", "eviction", "logs", "--file", str(log)], env)
    assert (result.returncode, result.stdout.splitlines()) == (
        0,
        [ONE_LINE.format(victims="Sequence 123 and 1 cached block")],
    )
    # --tail counts lines: the call is printed whole (before issue 48 it was cut to its last 2 events)
    result = sage(["llm", "eviction", "logs", "--file", str(log), "--tail", "1"], env)
    assert (result.returncode, result.stdout.splitlines()) == (
        0,
        [ONE_LINE.format(victims="Sequence 123 and 1 cached block")],
    )
    result = sage(["llm", "eviction", "logs", "--file", str(log), "--json"], env)
    assert [json.loads(line) for line in result.stdout.splitlines()] == EVENTS
    log.write_text("not json\n")
    assert_one_line_error(sage(["llm", "eviction", "logs", "--file", str(log)], env), 2, "evictions.jsonl:1")


# -- rendering ---------------------------------------------------------------------------------------

STATS = {
    "strategy": "LRU",
    "policy": "lru",
    "params": {},
    "total_evictions": 127,
    "eviction_calls": 13,
    "avg_eviction_time_us": 85.23,
    "p50_eviction_time_us": 70.0,
    "p99_eviction_time_us": 300.5,
    "re_prefill_rate": 0.183,
    "fairness_score": 0.8234,
    "hit_rate": 0.64,
    "memory_utilization": 0.931,
    "total_blocks": 1024,
    "used_blocks": 1000,
    "free_blocks": 24,
    "cached_blocks": 800,
    "evictable_blocks": 500,
    "pinned_blocks": 10,
    "total_freed_blocks": 127,
    "evictions_by_reason": {"alloc": 120, "watermark": 7},
    "evictions_by_policy": {"lru": 127},
    "preemptions": 2,
    "policy_swaps": 1,
    "last_swap_time_s": 0.0123,
}


def test_render_stats_is_the_spec_format() -> None:
    assert render_stats(STATS) == (
        "Eviction Policy Statistics:\n"
        "  Strategy: LRU\n"
        "  Total Evictions: 127\n"
        "  Avg Eviction Time: 85.2µs\n"
        "  Re-prefill Rate: 18.3%\n"
        "  Fairness Score: 0.82\n"
        "  Hit Rate: 64.0%\n"
        "  Memory Utilization: 93.1%"
    )


def test_render_stats_verbose_and_missing_values() -> None:
    verbose = render_stats(STATS, verbose=True)
    assert verbose.startswith(render_stats(STATS) + "\n")
    for line in (
        "  P99 Eviction Time: 300.5µs",
        "  Blocks: 1000 used / 1024 total (24 free, 800 cached, 500 evictable, 10 pinned)",
        "  By Reason: alloc=120, watermark=7",
        "  Last Swap Time: 12.3ms",
    ):
        assert line in verbose.splitlines()
    sparse = render_stats({"policy": "arc", "avg_eviction_time_us": None})
    assert "  Strategy: ARC" in sparse.splitlines()
    assert "  Avg Eviction Time: n/a" in sparse.splitlines()


def test_render_events() -> None:
    assert [render_event(e, tz=UTC) for e in EVENTS] == RENDERED
    one = {"event": "freed", "ts": 1767348933.0, "blocks_freed": 1, "total_freed": 1}
    assert render_event(one, tz=UTC).endswith("Freed 1 block, total freed: 1 block")
    other = {"event": "swap", "ts": 1767348933.0, "old": "lru", "new": "arc"}
    assert render_event(other, tz=UTC) == '[2026-01-02 10:15:33] SWAP: old="lru" new="arc"'
    assert render_event({"event": "evict"}, tz=UTC).startswith("[????-??-?? ??:??:??] EVICTION: Block #?")


def test_render_swap_and_status() -> None:
    answer = {
        "old": {"name": "lru", "params": {}},
        "new": {"name": "slru", "params": {"protected_threshold": 3}},
        "swap_time_s": 0.0032,
        "entries": 1024,
    }
    assert render_swap(answer) == (
        "Eviction policy: lru -> slru(protected_threshold=3) (swapped in 3.2 ms, 1024 entries carried over)"
    )
    engine = {
        "name": "default",
        "model": "sage-tiny",
        "pid": 42,
        "socket": "/tmp/e.sock",
        "device": "cpu",
        "implementation": "pure-python (SAGE_PURE_PYTHON=1)",
        "dtype": "float32",
        "kv_dtype": "bfloat16",
        "quantization": "int8",
        "packed_weights": "no",
        "compile": None,
        "started_at": 1767348932.0,
        "uptime_s": 3725.2,
        "policy": {"name": "lru", "params": {}},
        "num_blocks": 1024,
        "block_size": 16,
        "requests": {"running": 2, "waiting": 0, "finished": 17},
    }
    text = render_status(engine, tz=UTC)
    assert text.splitlines()[0] == "Engine Status:"
    assert "  Started:         2026-01-02 10:15:32 (up 1h 2m 5s)" in text.splitlines()
    assert "  KV Cache:        1024 blocks x 16 tokens" in text.splitlines()
    assert "  Implementation:  pure-python (SAGE_PURE_PYTHON=1)" in text.splitlines()
    precision = (
        "  Precision:       float32, KV cache bfloat16, quantization int8, packed weights no, compile off"
    )
    assert precision in text.splitlines()
    assert "  Requests:        2 running, 0 waiting, 17 finished" in text.splitlines()
    assert "  Threads:         ?" in text.splitlines()  # an engine from before --threads
    threads = {"threads": 2, "cores": 2, "omp_num_threads": None, "torch_threads": 2, "warnings": []}
    engine["threads"] = threads
    assert "  Threads:         2 (2 cores)" in render_status(engine, tz=UTC).splitlines()
    engine["threads"] = {**threads, "torch_threads": 3, "warnings": ["torch runs 3 threads"]}
    lines = render_status(engine, tz=UTC).splitlines()
    assert "  Threads:         3 (2 cores); warning: torch runs 3 threads" in lines


def test_policies_table_marks_the_active_policy() -> None:
    from rich.console import Console

    answer = {
        "active": "arc",
        "policies": [
            {
                "name": "arc",
                "strategy": "ARC",
                "paper": "Megiddo and Modha, FAST 2003",
                "offline": False,
                "params": {},
            },
            {
                "name": "slru",
                "strategy": "SLRU",
                "paper": "Karedla et al., 1994",
                "offline": False,
                "params": {"protected_threshold": 2},
            },
            {"name": "belady", "strategy": "BELADY", "paper": "Belady 1966", "offline": True, "params": {}},
        ],
    }
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(policies_table(answer))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    rows = {line.split("│")[2].strip(): line for line in text.splitlines() if line.count("│") > 3}
    assert "*" in rows["arc"].split("│")[1]
    assert "*" not in rows["slru"].split("│")[1]
    assert "protected_threshold=2" in rows["slru"]
    assert "(simulation only)" in rows["belady"]  # after its idea (issue 48: the idea column)


def test_output_sink() -> None:
    buffer = io.StringIO()
    Output(json_mode=True, stream=buffer).result({"a": 1}, lambda: "text")
    assert json.loads(buffer.getvalue()) == {"a": 1}
    buffer = io.StringIO()
    Output(json_mode=False, stream=buffer).result({"a": 1}, lambda: "[not] markup")
    assert buffer.getvalue() == "[not] markup\n"
    buffer = io.StringIO()
    Output(json_mode=True, stream=buffer).item({"b": [1, 2]}, lambda: "x")
    assert buffer.getvalue() == '{"b":[1,2]}\n'


def test_parse_params() -> None:
    assert parse_params(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    assert parse_params(None) == {}
    for bad in (["a"], ["=1"], ["a=1", "a=2"]):
        with pytest.raises(errors.CLIUsageError):
            parse_params(bad)


def test_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SAGE_HOME", str(tmp_path))
    monkeypatch.delenv("SAGE_SOCKET", raising=False)
    monkeypatch.delenv("SAGE_NAME", raising=False)
    assert resolve_socket() == tmp_path / "run" / "default.sock"
    assert resolve_socket(name="b") == tmp_path / "run" / "b.sock"
    monkeypatch.setenv("SAGE_NAME", "c")
    assert resolve_socket() == tmp_path / "run" / "c.sock"
    monkeypatch.setenv("SAGE_SOCKET", "/tmp/s.sock")
    assert resolve_socket() == Path("/tmp/s.sock")
    assert resolve_socket(name="b") == tmp_path / "run" / "b.sock"  # a flag beats the environment
    assert resolve_socket(Path("/x/y.sock")) == Path("/x/y.sock")
    assert pid_path(Path("/x/y.sock")) == Path("/x/y.pid")


# -- the client's error translation --------------------------------------------------------------------


def mock_client(handler: Any) -> ControlClient:
    return ControlClient("/tmp/unused.sock", transport=httpx.MockTransport(handler))


def test_client_engine_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            400, json={"error": {"type": "unknown_policy", "message": "unknown policy 'x'"}}
        )

    with pytest.raises(EngineError) as info:
        mock_client(handler).set_policy("x")
    assert (info.value.status_code, info.value.error_type, str(info.value)) == (
        400,
        "unknown_policy",
        "unknown policy 'x'",
    )
    assert errors.exit_code_for(info.value) == errors.EXIT_USAGE


def test_client_error_without_the_error_shape() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html><body>Bad gateway</body></html>")

    with pytest.raises(EngineError, match="GET /v1/eviction/stats: HTTP 502: <html>") as info:
        mock_client(handler).eviction_stats()
    assert errors.exit_code_for(info.value) == errors.EXIT_FAILURE


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"'])
def test_client_answer_that_is_not_an_object(body: bytes) -> None:
    with pytest.raises(EngineProtocolError, match="not a JSON object"):
        mock_client(lambda request: httpx.Response(200, content=body)).eviction_stats()


def test_client_logs_shape() -> None:
    with pytest.raises(EngineProtocolError, match="'events' is not a list"):
        mock_client(lambda request: httpx.Response(200, json={"events": {"a": 1}})).eviction_logs(5)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["tail"] == "7"
        return httpx.Response(200, json={"events": EVENTS})

    assert mock_client(handler).eviction_logs(7) == EVENTS


def test_client_follow_stream() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["follow"] == "true"
        lines = [json.dumps(EVENTS[0]), "", json.dumps(EVENTS[2]), ""]
        return httpx.Response(200, content="\n".join(lines).encode())

    assert list(mock_client(handler).follow_eviction_logs(0)) == [EVENTS[0], EVENTS[2]]
    garbage = mock_client(lambda request: httpx.Response(200, content=b"{oops\n"))
    with pytest.raises(EngineProtocolError, match="not JSON"):
        list(garbage.follow_eviction_logs(0))
    refused = mock_client(
        lambda request: httpx.Response(404, json={"error": {"type": "not_found", "message": "no"}})
    )
    with pytest.raises(EngineError, match="no"):
        list(refused.follow_eviction_logs(0))


def _raiser(exc: Exception) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


def _connect_error(cause: OSError) -> httpx.ConnectError:
    try:
        raise httpx.ConnectError(str(cause)) from cause
    except httpx.ConnectError as exc:
        return exc


def test_client_transport_errors() -> None:
    with pytest.raises(EngineTimeout, match="did not answer within"):
        mock_client(_raiser(httpx.ReadTimeout("slow"))).engine()
    with pytest.raises(EngineNotRunning, match="stale socket file"):
        mock_client(_raiser(_connect_error(ConnectionRefusedError(111, "Connection refused")))).engine()
    with pytest.raises(EngineConnectionError, match="permission denied"):
        mock_client(_raiser(_connect_error(PermissionError(13, "Permission denied")))).engine()
    with pytest.raises(EngineConnectionError, match="closed the connection"):
        mock_client(_raiser(httpx.RemoteProtocolError("Server disconnected"))).engine()


def test_client_shutdown_taken_when_the_engine_hangs_up() -> None:
    assert mock_client(_raiser(httpx.RemoteProtocolError("gone"))).shutdown() == {"status": "draining"}


def test_client_on_real_sockets(short_dir: Path) -> None:
    with pytest.raises(EngineNotRunning, match="no engine running") as info:
        ControlClient(short_dir / "missing.sock").health()
    assert not info.value.stale
    stale = short_dir / "stale.sock"
    bind_and_close(stale)
    with pytest.raises(EngineNotRunning, match="stale") as info:
        ControlClient(stale, start_hint="sage llm engine start --name x").health()
    assert info.value.stale
    assert "`sage llm engine start --name x`" in str(info.value)


def test_error_mapping() -> None:
    assert errors.exit_code_for(EngineNotRunning(Path("/x"))) == errors.EXIT_NO_ENGINE
    assert errors.exit_code_for(EngineTimeout("slow")) == errors.EXIT_TIMEOUT
    assert errors.exit_code_for(errors.CLIUsageError("bad")) == errors.EXIT_USAGE
    assert errors.exit_code_for(KeyboardInterrupt()) == errors.EXIT_INTERRUPTED
    assert errors.message_for(RuntimeError("boom")) == (
        "internal error: RuntimeError: boom (SAGE_DEBUG=1 shows the traceback)"
    )
    assert errors.message_for(FileNotFoundError(2, "No such file or directory", "/x")) == (
        "No such file or directory: /x"
    )


def test_benchmark_results_table() -> None:
    from rich.console import Console

    from sage_cli.benchmark.table import results_table

    rows = [
        {
            "policy": "lru",
            "capacity_blocks": 429,
            "hit_rate": 0.574,
            "re_prefill_rate": 0.406,
            "fairness_score": 1.0,
            "memory_utilization": 1.0,
            "evictions": 1810,
            "eviction_p50_us": 0.736,
            "throughput_impact": 0.493,
            "wall_s": 0.01,
        },
        {
            "policy": "unbounded",
            "capacity_blocks": 1432,
            "hit_rate": 0.675,
            "re_prefill_rate": 0.0,
            "fairness_score": 1.0,
            "memory_utilization": 0.0,
            "evictions": 0,
            "eviction_p50_us": 0.0,
            "throughput_impact": 0.0,
            "wall_s": 0.01,
        },
    ]
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(results_table({"workload": {}, "settings": {}, "results": rows}))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines[2].split() == [
        "Policy",
        "Blocks",
        "Hit",
        "Re-prefill",
        "Fair",
        "Util",
        "Evicted",
        "p50",
        "µs",
        "Tput",
        "loss",
    ]
    assert lines[4].split() == ["lru", "429", "57.4%", "40.6%", "1.00", "100.0%", "1810", "0.736", "49.3%"]
    assert lines[5].split()[:3] == ["unbounded", "1432", "67.5%"]
    assert results_table({"results": []}) == "No results."
