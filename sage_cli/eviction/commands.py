"""The commands of ``sage llm eviction``: stats, logs, set-policy, set-token-policy, policies,
explain, tree and top.

Every command here only talks to the engine over its socket (`sage_cli.client`): none imports
torch, `sage_eviction` or `engine_adapter` beyond `engine_adapter.paths` (``stats`` answers in a
new process in well under 0.4 s). What they print is made in `render`, `explanations` and `views`.
"""

from __future__ import annotations

import functools
import select
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.errors import CLIUsageError
from sage_cli.eviction.explanations import explain_lines, explain_one_line, is_eviction_of
from sage_cli.eviction.log_file import read_log_file
from sage_cli.eviction.render import policies_table, render_event, render_stats, render_swap, stats_block
from sage_cli.eviction.views import load_graphviz, render_top, tree_dot, tree_rich
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
    from rich.console import RenderableType

__all__ = ["explain", "logs", "policies", "set_policy", "set_token_policy", "stats", "top", "tree"]

WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")]
IntervalOpt = Annotated[
    float,
    typer.Option("--interval", min=0.1, metavar="SECONDS", help="Seconds between refreshes with --watch."),
]


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
                    out.item(snapshot, functools.partial(stats_block, snapshot, verbose))
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
            out.item(event, lambda: f"{render_event(event).split(' EVICTION:')[0]} {explain_one_line(event)}")

    try:
        if file is not None:
            if socket is not None or name is not None:
                raise CLIUsageError("--file reads a log file; it does not take --socket or --name")
            for event in read_log_file(file, tail, follow):
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


def explain(
    target: Annotated[
        str,
        typer.Argument(
            metavar="SEQ_OR_BLOCK", help="A sequence id, or a block key (a prefix of 4+ hex digits)."
        ),
    ],
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    tail: Annotated[
        int, typer.Option("--tail", min=1, metavar="N", help="Search the last N events of the log.")
    ] = 10_000,
    file: Annotated[
        Path | None,
        typer.Option("--file", metavar="PATH", dir_okay=False, show_default=False, help="Search a log file."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Explain a past eviction from the log: the victim's ranking values, the candidates it was
    chosen before, and the blocks passed over (pinned, in use, shared). Needs an engine started
    with --explain."""
    target = target.strip()
    if not target or not (target.isdigit() or all(c in "0123456789abcdefABCDEF" for c in target)):
        raise CLIUsageError(f"{target!r}: give a sequence id (digits) or a block key (hex)")
    if file is not None:
        if socket is not None or name is not None or url is not None:
            raise CLIUsageError("--file reads a log file; it does not take --socket, --name or --url")
        events = list(read_log_file(file, tail, False))
    else:
        with client_for(socket, name, url=url, api_key=api_key) as client:
            events = client.eviction_logs(tail)
    found = [e for e in events if is_eviction_of(e, target)]
    if not found:
        raise CLIUsageError(f"no eviction of {target} in the last {len(events)} events of the log")
    out = Output(json_out)
    for event in found:
        text = "\n".join(explain_lines(event))
        out.item(event, lambda text=text: text)


def tree(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    depth: Annotated[
        int, typer.Option("--depth", min=1, max=64, metavar="N", help="Node levels to show.")
    ] = 6,
    max_nodes: Annotated[
        int, typer.Option("--max-nodes", min=1, max=2000, metavar="N", help="Nodes to show in all.")
    ] = 60,
    dot: Annotated[
        Path | None,
        typer.Option("--dot", metavar="FILE", dir_okay=False, show_default=False, help="Write Graphviz DOT."),
    ] = None,
    png: Annotated[
        Path | None,
        typer.Option(
            "--png", metavar="FILE", dir_okay=False, show_default=False, help="Render a PNG (Graphviz's dot)."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the radix prefix tree of a running engine: token spans, blocks, hits, ref counts,
    evictable or pinned, tenant; recently evicted blocks as ghosts. Folded to --depth and
    --max-nodes; --dot and --png draw it with Graphviz."""
    if dot is not None or png is not None:
        load_graphviz()
        if png is not None and shutil.which("dot") is None:
            raise CLIUsageError(
                "--png needs Graphviz's dot program: apt-get install graphviz (or brew install graphviz)"
            )
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.cache_tree(depth, max_nodes)
    out = Output(json_out)
    if dot is not None:
        try:
            dot.write_text(tree_dot(answer).source, encoding="utf-8")
        except OSError as exc:
            raise CLIUsageError(f"{dot}: cannot write: {exc.strerror or exc}") from None
    if png is not None:
        graph = tree_dot(answer)
        try:
            png.write_bytes(graph.pipe(format="png"))
        except OSError as exc:
            raise CLIUsageError(f"{png}: cannot write: {exc.strerror or exc}") from None
        except Exception as exc:  # graphviz.ExecutableNotFound, CalledProcessError
            raise CLIUsageError(f"--png: Graphviz failed: {str(exc).splitlines()[0]}") from None
    out.result(answer, lambda: tree_rich(answer))



def _keys(interval: float) -> Iterator[str | None]:
    """Each `interval`, the key pressed meanwhile (None when none); stdin in cbreak mode when it
    is a terminal, restored at the end."""
    if not sys.stdin.isatty():
        while True:
            time.sleep(interval)
            yield None
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], interval)
            yield sys.stdin.read(1) if ready else None
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def top(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, metavar="SECONDS", help="Seconds between refreshes.")
    ] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """A live view of a running engine's cache: hit rate, evictions per second, re-prefill rate,
    pool use by tenant and class, the policy, the last victims with their explanations. q quits."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with client_for(socket, name, url=url, api_key=api_key) as client:

        def frame(previous: tuple[float, int] | None) -> tuple[RenderableType, tuple[float, int]]:
            stats = client.eviction_stats()
            usage = client.cache_usage()
            events = client.eviction_logs(200)
            now, total = time.monotonic(), int(stats.get("total_evictions") or 0)
            rate = None if previous is None else (total - previous[1]) / max(now - previous[0], 1e-9)
            return render_top(stats, usage, events, rate), (now, total)

        view, mark = frame(None)
        if once:
            console.print(view)
            return
        try:
            with Live(view, console=console, auto_refresh=False, screen=False) as live:
                for key in _keys(interval):
                    if key in ("q", "Q"):
                        return
                    view, mark = frame(mark)
                    live.update(view, refresh=True)
        except KeyboardInterrupt:
            return
