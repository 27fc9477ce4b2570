"""The commands of ``sage llm eviction``: stats, logs, set-policy, set-token-policy, policies,
explain, tree and top.

Every command here talks to the engine over its socket (`sage_cli.client`) but ``policies``,
which lists the policies installed here (`installed`, the registry) and asks an engine, if one
answers, only which it runs. None imports torch or `engine_adapter` beyond
`engine_adapter.paths`, and only ``policies`` imports `sage_eviction` (``stats`` answers in a new
process in well under 0.4 s). What they print is made in `render`, `explanations` and `views`.
"""

from __future__ import annotations

import functools
import select
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.errors import CLIUsageError
from sage_cli.eviction.explanations import (
    by_run,
    explain_lines,
    explain_one_line,
    is_eviction_of,
    run_heading,
)
from sage_cli.eviction.log_file import read_log_file
from sage_cli.eviction.log_tail import Unit, tail_events
from sage_cli.eviction.lookups import eviction_for, lookup_lines, read_lookups
from sage_cli.eviction.receipts_view import receipt_view
from sage_cli.eviction.render import (
    eviction_log_lines,
    policies_table,
    render_event,
    render_stats,
    render_swap,
    stats_block,
)
from sage_cli.eviction.views import load_graphviz, render_top, tree_dot, tree_rich
from sage_cli.options import (
    ApiKeyOpt,
    JsonOpt,
    NameOpt,
    OldPolicyOpt,
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


TailOpt = Annotated[
    int,
    typer.Option(
        "--tail", min=0, metavar="N", help="Show the last N lines (whole evictions; with --json, events)."
    ),
]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")]
LogJsonOpt = Annotated[bool, typer.Option("--json", help="Print the events as JSON lines.")]
LogExplainOpt = Annotated[
    bool, typer.Option("--explain", help="One line per victim with why it went (engine run with --explain).")
]
LogFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--file",
        metavar="PATH",
        help="Read an eviction log file (e.g. of a stopped engine) instead of asking the engine.",
        dir_okay=False,
        show_default=False,
    ),
]


def logs(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    tail: TailOpt = 50,
    follow: FollowOpt = False,
    json_out: LogJsonOpt = False,
    explain: LogExplainOpt = False,
    file: LogFileOpt = None,
) -> None:
    """Show the eviction log: one line per eviction (its victims by sequence, what it freed).

    --explain: one line per victim, with why it went. --json: the engine's events as they are,
    one JSON line each (an ``evict`` per victim, a ``freed`` per eviction). --tail counts the
    lines printed, and never cuts an eviction's line. The engine writes the log with
    --log-evictions to $SAGE_HOME/logs/<name>/evictions.jsonl; --file reads such a file
    directly, with no engine.
    """
    out = Output(json_out)

    def show(events: Iterable[dict[str, Any]]) -> None:
        if json_out:
            for event in events:
                out.item(event, lambda: "")
        elif not explain:
            for line in eviction_log_lines(events):
                out.item(None, lambda line=line: line)
        else:  # --explain: the victims, each on one line
            for event in events:
                if event.get("event") == "evict":
                    stamp = render_event(event).split(" EVICTION:")[0]
                    out.item(event, lambda event=event, stamp=stamp: f"{stamp} {explain_one_line(event)}")

    unit: Unit = "event" if json_out else "victim" if explain else "call"
    try:
        if file is not None:
            if socket is not None or name is not None:
                raise CLIUsageError("--file reads a log file; it does not take --socket or --name")
            show(_file_tail(file, tail, follow, unit))
            return
        with client_for(socket, name, url=url, api_key=api_key) as client:
            empty, events = tail_events(
                client.eviction_logs, client.follow_eviction_logs, tail, follow=follow, unit=unit
            )
            _say_when_empty(empty and tail > 0, follow, "since the engine started or its cache was reset")
            show(events)
    except KeyboardInterrupt:
        return


def _file_tail(file: Path, tail: int, follow: bool, unit: Unit) -> Iterable[dict[str, Any]]:
    """``logs --file``: the file's last `tail` lines (then, following, its new events)."""
    empty, events = tail_events(
        lambda k: list(read_log_file(file, k, False)),
        lambda k: read_log_file(file, k, True),
        tail,
        follow=follow,
        unit=unit,
    )
    _say_when_empty(empty and tail > 0, follow, f"in {file}")
    return events


def _say_when_empty(empty: bool, follow: bool, where: str) -> None:
    """An empty log says so (on stderr), rather than printing nothing at all."""
    if empty:
        waiting = "; waiting for the first (Ctrl-C stops)" if follow else ""
        Output.note(f"no evictions yet ({where}){waiting}")


def set_policy(
    policy: PolicyOpt = None,
    param: ParamOpt = None,
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
    old_policy: OldPolicyOpt = None,
) -> None:
    """Hot-swap the eviction policy of a running engine to NAME.

    The swap happens between two engine steps; the cached blocks carry over to the new policy
    and no request is lost. Prints the old and new policy and the swap time.
    """
    chosen = _policy_argument(policy, old_policy)
    params = parse_params(param)
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.set_policy(chosen.strip(), params)
    out.result(answer, lambda: render_swap(answer))


def _policy_argument(policy: str | None, old_policy: str | None) -> str:
    """NAME, positional as every eviction command takes its policy; the old ``--policy NAME``
    still works for one release, with a warning on stderr.

    Raises:
        CLIUsageError: No policy, or two different ones.
    """
    if old_policy is not None:
        Output.note(
            f"warning: --policy is deprecated and goes in the next release; write "
            f"`sage llm eviction set-policy {old_policy}`"
        )
        if policy is not None and policy != old_policy:
            raise CLIUsageError(f"two policies given ({policy!r} and --policy {old_policy!r}); give one NAME")
        return old_policy
    if policy is None:
        raise CLIUsageError("Missing argument 'NAME': the policy to swap to, e.g. `set-policy arc`")
    return policy


def set_token_policy(
    policy: Annotated[
        str,
        typer.Argument(
            metavar="SPEC",
            help="Token-level policy: a name (none, sliding, snapkv, h2o, tova, knorm, keydiff, leverage, "
            "compactor, expected_attention, adakv, pyramid) or NAME:k=v,k=v (adakv:snapkv).",
        ),
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
    """List the eviction policies installed here, with their params and papers; no engine needed.

    Read from the policy registry (built-ins and plugins). When an engine answers on the socket
    (or --url), the policy it runs is marked.
    """
    from sage_cli.client import EngineUnavailable
    from sage_cli.eviction.installed import installed_policies

    out = Output(json_out)
    answer: dict[str, Any] = {"active": None, "engine": None, "policies": installed_policies()}
    try:
        with client_for(socket, name, url=url, api_key=api_key) as client:
            answer["active"] = client.eviction_policies().get("active")
            answer["engine"] = str(url or client.socket)
    except EngineUnavailable:
        pass  # no engine to ask: the installed policies are the answer
    out.result(answer, lambda: policies_table(answer))


LookupOpt = Annotated[
    str | None,
    typer.Option(
        "--lookup",
        metavar="REQUEST_ID",
        show_default=False,
        help="Instead: a request's lookups from --lookup-log, each beside the eviction that cost its hit.",
    ),
]
RunOpt = Annotated[
    str | None,
    typer.Option(
        "--run",
        metavar="RUN",
        show_default=False,
        help="Only the records of this engine run (a log file may hold several: the headings name them).",
    ),
]
RequestOpt = Annotated[
    str | None,
    typer.Option(
        "--request",
        metavar="REQUEST_ID",
        show_default=False,
        help="Instead: what the cache did for a recent request (latest: the last), and why it missed.",
    ),
]
LookupLogOpt = Annotated[
    Path | None,
    typer.Option(
        "--lookup-log",
        metavar="PATH",
        dir_okay=False,
        show_default=False,
        help="The lookup log the engine writes (its --lookup-log).",
    ),
]


def explain(
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="SEQ_OR_BLOCK",
            show_default=False,
            help="A sequence id, or a block key (a prefix of 4+ hex digits).",
        ),
    ] = None,
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
    run: RunOpt = None,
    lookup: LookupOpt = None,
    lookup_log: LookupLogOpt = None,
    request: RequestOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Explain a past eviction from the log: the victim's ranking values, the candidates it was
    chosen before, and the blocks passed over (pinned, in use, shared). Needs an engine started
    with --explain. A log file appended to by several engine runs (sequence ids start again at
    each) is shown run by run, under a heading naming each; --run keeps one. With --lookup, a
    request's lookups (engine started with --lookup-log) and the evictions that cost their hits.
    With --request, a recent request's cache receipt: read per tier, written, uncached, and why
    each missed block was not there."""
    if request is not None:
        _explain_request(request, target, lookup, socket, name, url, api_key, Output(json_out))
        return
    target = _explain_target(target, lookup, lookup_log)
    events = _log_tail(file, tail, socket, name, url, api_key)
    if lookup is not None and lookup_log is not None:
        _explain_lookup(lookup, lookup_log, events, Output(json_out))
        return
    found = [e for e in events if is_eviction_of(e, target)]
    if run is not None:
        runs = [r for r, _ in by_run(events)]
        found = [e for e in found if e.get("run") == run]
        if not found and run not in runs:
            known = ", ".join(r for r in runs if r is not None) or "none"
            raise CLIUsageError(f"--run {run}: no such run in the log; runs: {known}")
    if not found:
        raise CLIUsageError(f"no eviction of {target} in the last {len(events)} events of the log")
    out = Output(json_out)
    groups = by_run(found)
    for group_run, group in groups:
        if len(groups) > 1 and not json_out:
            out.write(run_heading(group_run, group, target))
        for event in group:
            text = "\n".join(explain_lines(event))
            out.item(event, lambda text=text: text)


def _log_tail(
    file: Path | None, tail: int, socket: Path | None, name: str | None, url: str | None, api_key: str | None
) -> list[dict[str, Any]]:
    """The last `tail` events of the eviction log: the file's, else the engine's."""
    if file is not None:
        if socket is not None or name is not None or url is not None:
            raise CLIUsageError("--file reads a log file; it does not take --socket, --name or --url")
        return list(read_log_file(file, tail, False))
    with client_for(socket, name, url=url, api_key=api_key) as client:
        events: list[dict[str, Any]] = client.eviction_logs(tail)
    return events


def _explain_request(
    request_id: str, target: str | None, lookup: str | None,
    socket: Path | None, name: str | None, url: str | None, api_key: str | None, out: Output,
) -> None:  # fmt: skip
    """``explain --request``: the engine's receipt of the request (``GET /v1/cache/requests/{id}``)."""
    if target is not None or lookup is not None:
        raise CLIUsageError("give --request REQUEST_ID alone, without a sequence, block or --lookup")
    if not request_id.strip():
        raise CLIUsageError("--request: give a request id")
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.cache_request(request_id.strip())
    out.result(answer, lambda: receipt_view(answer))


def _explain_target(target: str | None, lookup: str | None, lookup_log: Path | None) -> str:
    """`explain`'s target checked: a sequence id or block key, or none with --lookup (which needs
    --lookup-log); "" for a lookup."""
    if lookup is not None:
        if target is not None:
            raise CLIUsageError("give a sequence or block, or --lookup REQUEST_ID, not both")
        if not lookup.strip():
            raise CLIUsageError("--lookup: give a request id")
        if lookup_log is None:
            raise CLIUsageError("--lookup reads the engine's lookup log: give its --lookup-log PATH")
        return ""
    if lookup_log is not None:
        raise CLIUsageError("--lookup-log goes with --lookup REQUEST_ID")
    target = (target or "").strip()
    if not target or not (target.isdigit() or all(c in "0123456789abcdefABCDEF" for c in target)):
        raise CLIUsageError(f"{target!r}: give a sequence id (digits) or a block key (hex)")
    return target


def _explain_lookup(request_id: str, path: Path, events: list[dict[str, Any]], out: Output) -> None:
    """``explain --lookup``: each lookup of the request, then the eviction that stopped it."""
    records = [r for r in read_lookups(path) if str(r.get("request_id")) == request_id.strip()]
    if not records:
        raise CLIUsageError(f"no lookup of request {request_id} in {path}")
    for record in records:
        event = eviction_for(record, events)
        lines = lookup_lines(record)
        if event is not None:
            lines += ["  " + line for line in explain_lines(event)]
        elif record.get("stop") == "evicted":
            lines.append(f"  (its evict event is not in the last {len(events)} events of the eviction log)")
        text = "\n".join(lines)
        out.item({"lookup": record, "eviction": event}, lambda text=text: text)


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
        # TCSANOW, not tty's default TCSAFLUSH: that would discard a q pressed while the first
        # frame was drawn (before this line), and top would not quit on it.
        tty.setcbreak(fd, termios.TCSANOW)
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
