"""``sage llm eviction``: statistics, the eviction log and the policy of a running engine.

Every command here only talks to the engine over its socket: none imports torch,
`engine_adapter` or `sage_eviction` (``stats`` answers in a new process in well under 0.4 s).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.errors import CLIUsageError
from sage_cli.options import (
    ApiKeyOpt,
    JsonOpt,
    NameOpt,
    ParamOpt,
    PolicyOpt,
    SocketOpt,
    UrlOpt,
    client_for,
    parse_params,
)
from sage_cli.output import Output

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "app",
    "policies_table",
    "render_event",
    "render_stats",
    "render_swap",
]

app = typer.Typer(
    name="eviction",
    help="Inspect and change the eviction policy of a running engine.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


# -- rendering (pure functions of the engine's JSON) ---------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _percent(value: Any) -> str:
    x = _number(value)
    return "n/a" if x is None else f"{x * 100:.1f}%"


def _micros(value: Any) -> str:
    x = _number(value)
    return "n/a" if x is None else f"{x:.1f}µs"


def _count(value: Any) -> str:
    x = _number(value)
    return "n/a" if x is None else f"{int(x)}"


def _strategy(stats: dict[str, Any]) -> str:
    strategy = stats.get("strategy") or str(stats.get("policy") or "unknown").upper()
    return str(strategy)


def render_stats(stats: dict[str, Any], *, verbose: bool = False) -> str:
    """The module spec's statistics block, plus hit rate and memory utilization.

    ``verbose`` adds the tail latencies, the pool and the counters by reason.
    """
    fairness = _number(stats.get("fairness_score"))
    lines = [
        "Eviction Policy Statistics:",
        f"  Strategy: {_strategy(stats)}",
        f"  Total Evictions: {_count(stats.get('total_evictions'))}",
        f"  Avg Eviction Time: {_micros(stats.get('avg_eviction_time_us'))}",
        f"  Re-prefill Rate: {_percent(stats.get('re_prefill_rate'))}",
        f"  Fairness Score: {'n/a' if fairness is None else f'{fairness:.2f}'}",
        f"  Hit Rate: {_percent(stats.get('hit_rate'))}",
        f"  Memory Utilization: {_percent(stats.get('memory_utilization'))}",
    ]
    if verbose:
        params = stats.get("params") or {}
        if params:
            lines.append(f"  Params: {_params_text(params)}")
        lines += [
            f"  P50 Eviction Time: {_micros(stats.get('p50_eviction_time_us'))}",
            f"  P99 Eviction Time: {_micros(stats.get('p99_eviction_time_us'))}",
            f"  Eviction Calls: {_count(stats.get('eviction_calls'))}",
            f"  Total Freed Blocks: {_count(stats.get('total_freed_blocks'))}",
            "  Blocks: {} used / {} total ({} free, {} cached, {} evictable, {} pinned)".format(
                *(
                    _count(stats.get(k))
                    for k in (
                        "used_blocks",
                        "total_blocks",
                        "free_blocks",
                        "cached_blocks",
                        "evictable_blocks",
                        "pinned_blocks",
                    )
                )
            ),
            f"  Preemptions: {_count(stats.get('preemptions'))}",
            f"  Policy Swaps: {_count(stats.get('policy_swaps'))}",
        ]
        swap = _number(stats.get("last_swap_time_s"))
        if swap is not None:
            lines.append(f"  Last Swap Time: {swap * 1000:.1f}ms")
        for key, title in (("evictions_by_reason", "By Reason"), ("evictions_by_policy", "By Policy")):
            counts = stats.get(key)
            if isinstance(counts, dict) and counts:
                lines.append(f"  {title}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    token = stats.get("token_eviction")
    if isinstance(token, dict):
        lines += _token_lines(token)
    colocation = stats.get("colocation")
    if isinstance(colocation, dict):
        lines += _colocation_lines(colocation)
    return "\n".join(lines)


def _colocation_lines(colocation: dict[str, Any]) -> list[str]:
    """LLM + embedding colocation (spec 004): the quotas, their use, the admission decisions."""
    quota = colocation.get("quota") or {}
    used = colocation.get("used") or {}
    decisions = colocation.get("decisions") or {}
    lines = [
        "Colocation:",
        f"  Mode: {colocation.get('mode', '?')} ({colocation.get('system', '?')})",
        f"  LLM Quota: {_count(quota.get('llm_blocks'))} blocks ({_count(used.get('llm_blocks'))} used)",
        f"  Embedding Quota: {_count(quota.get('embedding_blocks'))} blocks "
        f"({_count(used.get('embedding_blocks'))} reserved)",
        f"  Deferred: {_count(colocation.get('deferred'))}",
    ]
    if isinstance(decisions, dict) and decisions:
        lines.append("  Decisions: " + ", ".join(f"{k}={v}" for k, v in decisions.items()))
    return lines


def _token_lines(token: dict[str, Any]) -> list[str]:
    """Token-level eviction (spec 002): tokens evicted and memory freed, by policy."""
    freed = _number(token.get("bytes_freed_total"))
    lines = [
        "Token Eviction:",
        f"  Policy: {token.get('policy', '?')}",
        f"  Compressions: {_count(token.get('compressions'))}",
        f"  Tokens Evicted: {_count(token.get('tokens_evicted_total'))}",
        f"  Memory Freed: {'?' if freed is None else f'{freed / 2**20:.1f} MiB'}",
    ]
    for key, title in (("tokens_evicted", "Tokens By Policy"), ("by_reason", "Compressions By Reason")):
        counts = token.get(key)
        if isinstance(counts, dict) and counts:
            lines.append(f"  {title}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return lines


def _stats_block(stats: dict[str, Any], verbose: bool) -> str:
    """One refresh of ``stats --watch`` when the output is not a terminal: the block, a blank line."""
    return render_stats(stats, verbose=verbose) + "\n"


def _timestamp(ts: Any, tz: dt.tzinfo | None) -> str:
    x = _number(ts)
    if x is None:
        return "????-??-?? ??:??:??"
    return dt.datetime.fromtimestamp(x, tz=tz or dt.datetime.now().astimezone().tzinfo).strftime(
        "%Y-%m-%d %H:%M:%S"
    )


def _plural(n: Any, word: str) -> str:
    count = _count(n)
    return f"{count} {word}" if count == "1" else f"{count} {word}s"


def render_event(event: dict[str, Any], *, tz: dt.tzinfo | None = None) -> str:
    """One eviction event as the module spec prints it.

    ``[2026-01-02 10:15:32] EVICTION: Sequence 123 evicted (LRU, last_access=1735797332.1)``
    ``[2026-01-02 10:15:33] EVICTION: Freed 10 blocks, total freed: 127 blocks``

    Args:
        event: One event of the eviction log (docs/architecture.md, "Control API").
        tz: The time zone of the timestamp; the local one by default.
    """
    stamp = f"[{_timestamp(event.get('ts'), tz)}]"
    kind = event.get("event")
    policy = str(event.get("policy") or "?").upper()
    if kind == "evict":
        sequence_id = event.get("sequence_id")
        if sequence_id is not None:
            who = f"Sequence {sequence_id}"
        else:
            block = event.get("block")
            who = f"Block {str(block)[:8]}..." if block else f"Block #{event.get('block_id', '?')}"
        last_access = _number(event.get("last_access"))
        last = "?" if last_access is None else f"{last_access:.1f}"
        return f"{stamp} EVICTION: {who} evicted ({policy}, last_access={last})"
    if kind == "freed":
        return (
            f"{stamp} EVICTION: Freed {_plural(event.get('blocks_freed'), 'block')}, "
            f"total freed: {_plural(event.get('total_freed'), 'block')}"
        )
    if kind == "compress":
        return (
            f"{stamp} COMPRESSION: Sequence {event.get('sequence_id', '?')} kept "
            f"{event.get('tokens_after', '?')} of {event.get('tokens_before', '?')} tokens "
            f"({policy}, {event.get('reason', '?')}), freed {_plural(event.get('blocks_freed'), 'block')}"
        )
    # An event this CLI does not know yet (a policy swap, say): show its fields.
    rest = " ".join(f"{k}={json.dumps(v)}" for k, v in event.items() if k not in ("event", "ts"))
    return f"{stamp} {str(kind or 'event').upper()}: {rest}".rstrip()


def _params_text(params: Any) -> str:
    if not isinstance(params, dict) or not params:
        return "-"
    return ", ".join(
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={json.dumps(v)}" for k, v in params.items()
    )


def _spec_text(side: Any) -> str:
    if not isinstance(side, dict):
        return "?"
    params = side.get("params")
    name = str(side.get("name", "?"))
    return f"{name}({_params_text(params)})" if isinstance(params, dict) and params else name


def render_swap(answer: dict[str, Any]) -> str:
    """``Eviction policy: lru -> arc (swapped in 3.2 ms, 1024 entries carried over)``."""
    swap = _number(answer.get("swap_time_s"))
    took = "?" if swap is None else f"{swap * 1000:.1f} ms"
    entries = answer.get("entries")
    carried = ""
    if entries is not None:
        carried = f", {_count(entries)} {'entry' if _count(entries) == '1' else 'entries'} carried over"
    return (
        f"Eviction policy: {_spec_text(answer.get('old'))} -> {_spec_text(answer.get('new'))} "
        f"(swapped in {took}{carried})"
    )


def policies_table(answer: dict[str, Any]) -> Table:
    """The policies an engine offers: name, params with defaults, paper; the active one marked."""
    from rich.table import Table

    active = answer.get("active")
    table = Table(title="Eviction policies", title_justify="left")
    table.add_column("", width=1, no_wrap=True)
    table.add_column("Policy", no_wrap=True)
    table.add_column("Params (defaults)")
    table.add_column("Paper")
    for policy in answer.get("policies") or []:
        name = str(policy.get("name", "?"))
        offline = " (sim only)" if policy.get("offline") else ""
        table.add_row(
            "*" if name == active else "",
            name + offline,
            _params_text(policy.get("params")),
            str(policy.get("paper") or ""),
        )
    table.caption = f"* active: {active}" if active else None
    table.caption_justify = "left"
    return table


# -- commands -------------------------------------------------------------------------------------

WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")]
IntervalOpt = Annotated[
    float,
    typer.Option("--interval", min=0.1, metavar="SECONDS", help="Seconds between refreshes with --watch."),
]


@app.command("stats")
def stats(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
    watch: WatchOpt = False,
    interval: IntervalOpt = 1.0,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also show tail latencies, blocks and counters.")
    ] = False,
) -> None:
    """Show the eviction statistics of a running engine.

    Strategy, evictions, average policy time per eviction call, re-prefill rate, fairness
    (Jain's index over tenants), prefix-cache hit rate and memory utilization. With --json the
    engine's object is printed as is; with --watch --json one JSON line per refresh.
    """
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        if not watch:
            answer = client.eviction_stats()
            out.result(answer, lambda: render_stats(answer, verbose=verbose))
            return
        try:
            if json_out or not out.is_terminal():
                while True:
                    snapshot = client.eviction_stats()
                    out.item(snapshot, functools.partial(_stats_block, snapshot, verbose))
                    time.sleep(interval)
            from rich.live import Live
            from rich.text import Text

            answer = client.eviction_stats()
            with Live(
                Text(render_stats(answer, verbose=verbose)), console=out.console, auto_refresh=False
            ) as live:
                while True:
                    time.sleep(interval)
                    answer = client.eviction_stats()
                    live.update(Text(render_stats(answer, verbose=verbose)), refresh=True)
        except KeyboardInterrupt:
            return


@app.command("logs")
def logs(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    tail: Annotated[int, typer.Option("--tail", min=0, metavar="N", help="Show the last N events.")] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the events as JSON lines.")] = False,
    explain: Annotated[
        bool,
        typer.Option("--explain", help="One line per victim with why it went (engine run with --explain)."),
    ] = False,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            metavar="PATH",
            help="Read an eviction log file (e.g. of a stopped engine) instead of asking the engine.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show the eviction log: one line per evicted block and per eviction call.

    The engine writes it with --log-evictions to $SAGE_HOME/logs/<name>/evictions.jsonl;
    --file reads such a file directly, with no engine.
    """
    out = Output(json_out)

    def show(event: dict[str, Any]) -> None:
        if not explain:
            out.item(event, lambda: render_event(event))
        elif event.get("event") == "evict":  # --explain: the victims, each on one line
            from sage_cli.eviction_view import explain_one_line

            out.item(event, lambda: f"{render_event(event).split(' EVICTION:')[0]} {explain_one_line(event)}")

    try:
        if file is not None:
            if socket is not None or name is not None:
                raise CLIUsageError("--file reads a log file; it does not take --socket or --name")
            for event in _read_log_file(file, tail, follow):
                show(event)
            return
        with client_for(socket, name, url=url, api_key=api_key) as client:
            if follow:
                for event in client.follow_eviction_logs(tail):
                    show(event)
            else:
                for event in client.eviction_logs(tail):
                    show(event)
    except KeyboardInterrupt:
        return


def _parse_log_line(path: Path, lineno: int, line: str) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise CLIUsageError(f"{path}:{lineno}: not a JSON line") from None
    if not isinstance(event, dict):
        raise CLIUsageError(f"{path}:{lineno}: not a JSON object")
    return event


def _read_log_file(path: Path, tail: int, follow: bool) -> Iterator[dict[str, Any]]:
    """The last `tail` events of a JSON-lines log file, then (with `follow`) new ones, across
    rotations (a new inode or a shorter file starts over)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise CLIUsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        last: deque[tuple[int, str]] = deque(maxlen=tail)
        lineno = 0
        for line in handle:
            lineno += 1
            if line.strip():
                last.append((lineno, line))
        for n, line in last:
            event = _parse_log_line(path, n, line)
            if event is not None:
                yield event
        if not follow:
            return
        inode = os.fstat(handle.fileno()).st_ino
        partial = ""
        while True:
            line = handle.readline()
            if line:
                partial += line
                if partial.endswith("\n"):
                    lineno += 1
                    event = _parse_log_line(path, lineno, partial)
                    partial = ""
                    if event is not None:
                        yield event
                continue
            time.sleep(0.2)
            try:
                now = path.stat()
            except FileNotFoundError:
                continue  # between the rename and the new file of a rotation
            if now.st_ino != inode or now.st_size < handle.tell():
                handle.close()
                handle = path.open(encoding="utf-8")
                inode, lineno, partial = os.fstat(handle.fileno()).st_ino, 0, ""
    finally:
        handle.close()


@app.command("set-policy")
def set_policy(
    policy: PolicyOpt,
    param: ParamOpt = None,
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Hot-swap the eviction policy of a running engine.

    The swap happens between two engine steps; the cached blocks carry over to the new policy
    and no request is lost. Prints the old and new policy and the swap time.
    """
    params = parse_params(param)
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.set_policy(policy.strip(), params)
    out.result(answer, lambda: render_swap(answer))


@app.command("set-token-policy")
def set_token_policy(
    policy: Annotated[
        str,
        typer.Argument(metavar="NAME", help="Token-level policy: none, sliding, snapkv, h2o, tova."),
    ],
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Hot-swap the token-level eviction policy of a running engine (--token-eviction).

    The swap happens between two engine steps; running sequences keep what their attention
    observed so far. Prints the old and new policy.
    """
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.set_token_policy(policy.strip())
    out.result(answer, lambda: f"Token eviction policy: {answer.get('old', '?')} -> {answer.get('new', '?')}")


@app.command("policies")
def policies(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List the eviction policies a running engine offers, with their params and papers."""
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.eviction_policies()
    out.result(answer, lambda: policies_table(answer))
