"""``sage llm eviction explain | tree | top``: why blocks left, the prefix tree, a live view.

Like the rest of ``sage llm eviction`` these talk to the engine only through the control client
(sage_cli/client.py) and import neither torch nor `engine_adapter`. The renderers are pure
functions of the engine's JSON (docs/architecture.md, "Explaining an eviction" and "The cache
as a picture"), so the tests feed them recorded answers too.
"""

from __future__ import annotations

import datetime as dt
import math
import select
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.errors import CLIUsageError
from sage_cli.eviction import _read_log_file, app
from sage_cli.options import ApiKeyOpt, JsonOpt, NameOpt, SocketOpt, UrlOpt, client_for
from sage_cli.output import Output

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.tree import Tree

__all__ = [
    "explain_lines",
    "explain_one_line",
    "render_top",
    "tree_dot",
    "tree_rich",
]

_COMMON = ("policy", "evictable", "last_access", "priority", "tenant")
GHOST_STYLE = "dim italic"


# -- explanations --------------------------------------------------------------------------------


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "(" + ", ".join(_value(v) for v in value) + ")"
    return str(value)


def _values(values: Any, *, skip: tuple[str, ...] = _COMMON) -> str:
    if not isinstance(values, dict):
        return "-"
    return " ".join(f"{k}={_value(v)}" for k, v in values.items() if k not in skip) or "-"


def _short(block: Any) -> str:
    return str(block)[:10] if block else "?"


def _who(event: dict[str, Any]) -> str:
    parts = [f"block {_short(event.get('block'))}"]
    extra = []
    if event.get("sequence_id") is not None:
        extra.append(f"seq {event['sequence_id']}")
    if event.get("tenant") is not None:
        extra.append(f"tenant {event['tenant']}")
    if extra:
        parts.append(f"({', '.join(extra)})")
    return " ".join(parts)


def _counts(counts: Any) -> str:
    if not isinstance(counts, dict):
        return ""
    names = {"referenced": "in use", "pinned": "pinned", "shared": "shared prefix"}
    return ", ".join(f"{n} {names.get(k, k)}" for k, n in counts.items() if n)


def explain_one_line(event: dict[str, Any]) -> str:
    """One readable line per victim (``sage llm eviction logs --explain``, ``top``)."""
    policy = str(event.get("policy") or "?").upper()
    head = f"{_who(event)} evicted by {policy} for {event.get('reason', '?')}"
    why = event.get("explain")
    if not isinstance(why, dict):
        return f"{head} (no explanation: the engine runs without --explain)"
    line = f"{head}: {_values(why.get('values'))}"
    preferred = why.get("preferred_to") or []
    if preferred:
        line += "; before " + ", ".join(
            f"{_short(p.get('block'))} [{_values(p.get('values'))}]" for p in preferred if isinstance(p, dict)
        )
    skipped = why.get("skipped") or []
    if skipped:
        line += "; skipped " + ", ".join(
            f"{_short(s.get('block'))} ({s.get('why')})" for s in skipped if isinstance(s, dict)
        )
    return line


def explain_lines(event: dict[str, Any]) -> list[str]:
    """A past eviction, explained in full (``sage llm eviction explain``)."""
    ts = event.get("ts")
    when = (
        dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(ts, int | float)
        else "?"
    )
    block_id = event.get("block_id")
    lines = [
        f"{_who(event)} [pool block {block_id}] evicted at {when} by "
        f"{str(event.get('policy') or '?').upper()} for {event.get('reason', '?')}"
    ]
    why = event.get("explain")
    if not isinstance(why, dict):
        lines.append("  no explanation recorded: start the engine with --explain")
        return lines
    lines.append(f"  ranked by: {why.get('ranks_by', '?')}")
    lines.append(f"  its values: {_values(why.get('values'), skip=('policy', 'evictable'))}")
    preferred = [p for p in why.get("preferred_to") or [] if isinstance(p, dict)]
    if preferred:
        lines.append("  chosen before the next candidates:")
        for p in preferred:
            seq = f" (seq {p['sequence_id']})" if p.get("sequence_id") is not None else ""
            lines.append(f"    {_short(p.get('block'))}{seq}: {_values(p.get('values'))}")
    else:
        lines.append("  it was the last evictable block")
    skipped = [s for s in why.get("skipped") or [] if isinstance(s, dict)]
    before = why.get("skipped_before", 0)
    if skipped:
        lines.append(f"  passed over ({before} would have gone first but could not):")
        for s in skipped:
            lines.append(f"    {_short(s.get('block'))}: {s.get('why')}, rank={_value(s.get('rank'))}")
    counts = _counts(why.get("skipped_counts"))
    if counts:
        lines.append(f"  not evictable then: {counts}")
    return lines


def _matches(event: dict[str, Any], target: str) -> bool:
    if event.get("event") != "evict":
        return False
    if target.isdigit() and event.get("sequence_id") == int(target):
        return True
    block = event.get("block")
    return isinstance(block, str) and len(target) >= 4 and block.startswith(target.lower())


@app.command("explain")
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
        events = list(_read_log_file(file, tail, False))
    else:
        with client_for(socket, name, url=url, api_key=api_key) as client:
            events = client.eviction_logs(tail)
    found = [e for e in events if _matches(e, target)]
    if not found:
        raise CLIUsageError(f"no eviction of {target} in the last {len(events)} events of the log")
    out = Output(json_out)
    for event in found:
        text = "\n".join(explain_lines(event))
        out.item(event, lambda text=text: text)


# -- the tree ------------------------------------------------------------------------------------


def _age(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "?"
    seconds = max(0.0, time.time() - ts)
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def _node_label(node: dict[str, Any]) -> str:
    if node.get("ghost"):
        return (
            f"ghost {_short(node.get('id'))} evicted {_age(node.get('evicted_at'))} ago "
            f"({node.get('reason', '?')}, {node.get('policy', '?')}, hits {node.get('hits', '?')})"
        )
    start, end = node.get("tokens", ["?", "?"])
    if node.get("pinned"):
        state = "pinned"
    elif node.get("evictable"):
        state = "evictable"
    elif node.get("ref_count"):
        state = "in use"
    else:
        state = "shared"
    tenant = f" · tenant {node['tenant']}" if node.get("tenant") is not None else ""
    return (
        f"tokens {start}-{end} · {node.get('blocks')} block{'s' if node.get('blocks') != 1 else ''} · "
        f"hits {node.get('hits')} · ref {node.get('ref_count')} · {state}{tenant} · {_short(node.get('id'))}"
    )


def _hidden_label(hidden: Any) -> str | None:
    if isinstance(hidden, dict) and hidden.get("nodes"):
        return f"… {hidden['nodes']} more node(s), {hidden.get('blocks', '?')} block(s)"
    return None


def tree_rich(tree: dict[str, Any]) -> Tree:
    """The tree as a Rich `Tree`: cached nodes plain, pinned bold, ghosts dim italic."""
    from rich.text import Text
    from rich.tree import Tree

    title = (
        f"prefix cache: {tree.get('cached_blocks')} cached blocks of {tree.get('num_blocks')} "
        f"({tree.get('policy')}), {tree.get('shown_nodes')} nodes shown"
    )
    root = Tree(Text(title, style="bold"))

    def add(parent: Tree, node: dict[str, Any]) -> None:
        ghost = bool(node.get("ghost"))
        style = GHOST_STYLE if ghost else ("bold" if node.get("pinned") else "")
        branch = parent.add(Text(_node_label(node), style=style))
        for child in node.get("children", []):
            add(branch, child)
        for child in node.get("ghosts", []):
            add(branch, child)
        hidden = _hidden_label(node.get("hidden"))
        if hidden:
            branch.add(Text(hidden, style="dim"))

    for node in tree.get("roots", []):
        add(root, node)
    hidden = _hidden_label(tree.get("hidden"))
    if hidden:
        root.add(Text(hidden, style="dim"))
    if not tree.get("roots"):
        root.add(Text("(empty)", style="dim"))
    return root


def _graphviz() -> Any:
    try:
        import graphviz
    except ImportError:
        raise CLIUsageError("--dot and --png need the graphviz package: pip install 'sage-kv[viz]'") from None
    return graphviz


def tree_dot(tree: dict[str, Any]) -> Any:
    """The tree as a `graphviz.Digraph`: cached nodes as boxes, ghosts dashed and grey."""
    graphviz = _graphviz()
    dot = graphviz.Digraph("sage_prefix_cache", graph_attr={"rankdir": "LR"}, node_attr={"shape": "box"})
    dot.node(
        "root", f"root\\n{tree.get('cached_blocks')} cached blocks ({tree.get('policy')})", shape="ellipse"
    )
    counter = iter(range(1, 1 << 30))

    def add(parent: str, node: dict[str, Any]) -> None:
        me = f"n{next(counter)}"
        if node.get("ghost"):
            dot.node(me, _node_label(node), style="dashed", color="grey60", fontcolor="grey50")
            dot.edge(parent, me, style="dashed", color="grey60")
        else:
            fill = "lightblue" if node.get("pinned") else ("palegreen" if node.get("evictable") else "white")
            dot.node(me, _node_label(node).replace(" · ", "\\n"), style="filled", fillcolor=fill)
            dot.edge(parent, me)
        for child in [*node.get("children", []), *node.get("ghosts", [])]:
            add(me, child)
        hidden = _hidden_label(node.get("hidden"))
        if hidden:
            more = f"n{next(counter)}"
            dot.node(more, hidden, shape="plaintext")
            dot.edge(me, more, style="dotted")

    for node in tree.get("roots", []):
        add("root", node)
    return dot


@app.command("tree")
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
        _graphviz()
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


# -- top -----------------------------------------------------------------------------------------


def _pct(value: Any) -> str:
    return f"{value * 100:.1f}%" if isinstance(value, int | float) and math.isfinite(value) else "-"


def render_top(
    stats: dict[str, Any], usage: dict[str, Any], events: list[dict[str, Any]], rate: float | None
) -> RenderableType:
    """One frame of ``top``: the headline figures, pool use by tenant and class, the last victims."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 3))
    for _ in range(4):
        head.add_column()
    head.add_row(
        f"policy {stats.get('strategy') or usage.get('policy') or '?'}",
        f"hit rate {_pct(stats.get('hit_rate'))}",
        f"evictions/s {'-' if rate is None else f'{rate:.1f}'}",
        f"re-prefill {_pct(stats.get('re_prefill_rate'))}",
    )
    head.add_row(
        f"pool {usage.get('used_blocks', '?')}/{usage.get('num_blocks', '?')} blocks",
        f"cached {usage.get('cached_blocks', '?')} (evictable {usage.get('evictable_blocks', '?')})",
        f"requests {usage.get('running', '?')} running, {usage.get('waiting', '?')} waiting",
        f"batch limit {usage.get('max_running_batch', '?')}"
        + (" (adaptive)" if usage.get("adaptive_batch") else ""),
    )
    use = Table(title="pool use", title_justify="left", box=None, pad_edge=False)
    use.add_column("tenant")
    use.add_column("blocks", justify="right")
    use.add_column("class")
    use.add_column("blocks", justify="right")
    tenants = sorted((usage.get("by_tenant") or {}).items(), key=lambda kv: -kv[1])[:8]
    classes = sorted((usage.get("by_class") or {}).items(), key=lambda kv: -kv[1])
    for i in range(max(len(tenants), len(classes), 1)):
        t = tenants[i] if i < len(tenants) else ("", "")
        c = classes[i] if i < len(classes) else ("", "")
        use.add_row(str(t[0]), str(t[1]), str(c[0]), str(c[1]))
    victims = [e for e in events if e.get("event") == "evict"][-8:]
    lines = [Text("last victims", style="bold")]
    lines += [Text(explain_one_line(e), overflow="ellipsis", no_wrap=True) for e in reversed(victims)]
    if not victims:
        lines.append(Text("(none yet)", style="dim"))
    return Group(head, Text(""), use, Text(""), *lines, Text("q quits", style="dim"))


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


@app.command("top")
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
