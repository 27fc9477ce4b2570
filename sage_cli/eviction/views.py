"""The cache as a picture: the radix prefix tree (Rich or Graphviz) and the frames of ``top``.

Pure functions of the engine's JSON (docs/architecture.md, "The cache as a picture"); Rich and
graphviz are imported only when a picture is made.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from sage_cli.errors import CLIUsageError
from sage_cli.eviction.ages_view import thrashing_warning
from sage_cli.eviction.explanations import explain_one_line, short_block

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.tree import Tree

__all__ = ["GHOST_STYLE", "PNG_DPI", "PNG_MAX_INCHES", "load_graphviz", "render_top", "tree_dot", "tree_rich"]

GHOST_STYLE = "dim italic"


# -- the tree ------------------------------------------------------------------------------------


def _age(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "?"
    seconds = max(0.0, time.time() - ts)
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def _node_label(node: dict[str, Any]) -> str:
    if node.get("ghost"):
        return (
            f"ghost {short_block(node.get('id'))} evicted {_age(node.get('evicted_at'))} ago "
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
        f"hits {node.get('hits')} · ref {node.get('ref_count')} · {state}{tenant} · "
        f"{short_block(node.get('id'))}"
    )


def _hidden_label(hidden: Any) -> str | None:
    if isinstance(hidden, dict) and hidden.get("nodes"):
        return f"… {hidden['nodes']} more node(s), {hidden.get('blocks', '?')} block(s)"
    return None


def _hidden_ghosts_label(count: Any) -> str | None:
    """The ghosts cut by --depth or --max-nodes below a node (the engine counts them)."""
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return f"… {count} more evicted block(s) (ghosts beyond --depth or --max-nodes)"
    return None


PNG_MAX_INCHES = 40
PNG_DPI = 96
"""``--png`` is at most PNG_MAX_INCHES x PNG_DPI = 3,840 pixels a side: Graphviz scales a
larger drawing down to fit (``size``), whatever the tree (the nodes are bounded by
--max-nodes, ghosts included, but a wide level could still draw tens of thousands of pixels)."""


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
        for label in (_hidden_label(node.get("hidden")), _hidden_ghosts_label(node.get("hidden_ghosts"))):
            if label:
                branch.add(Text(label, style="dim"))

    for node in tree.get("roots", []):
        add(root, node)
    for label in (_hidden_label(tree.get("hidden")), _hidden_ghosts_label(tree.get("hidden_ghosts"))):
        if label:
            root.add(Text(label, style="dim"))
    if not tree.get("roots"):
        root.add(Text("(empty)", style="dim"))
    return root


def load_graphviz() -> Any:
    try:
        import graphviz
    except ImportError:
        raise CLIUsageError("--dot and --png need the graphviz package: pip install 'sage-kv[viz]'") from None
    return graphviz


def tree_dot(tree: dict[str, Any]) -> Any:
    """The tree as a `graphviz.Digraph`: cached nodes as boxes, ghosts dashed and grey; rendered,
    at most `PNG_MAX_INCHES` x `PNG_DPI` pixels a side."""
    graphviz = load_graphviz()
    bounds = {"rankdir": "LR", "size": f"{PNG_MAX_INCHES},{PNG_MAX_INCHES}", "dpi": str(PNG_DPI)}
    dot = graphviz.Digraph("sage_prefix_cache", graph_attr=bounds, node_attr={"shape": "box"})
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
        more_below(me, node)

    def more_below(parent: str, node: dict[str, Any]) -> None:
        for label in (_hidden_label(node.get("hidden")), _hidden_ghosts_label(node.get("hidden_ghosts"))):
            if label:
                more = f"n{next(counter)}"
                dot.node(more, label, shape="plaintext")
                dot.edge(parent, more, style="dotted")

    for node in tree.get("roots", []):
        add("root", node)
    more_below("root", tree)
    return dot



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
    for _ in range(5):
        head.add_column()
    head.add_row(
        f"policy {stats.get('strategy') or usage.get('policy') or '?'}",
        f"hit rate {_pct(stats.get('hit_rate'))}",
        f"evictions/s {'-' if rate is None else f'{rate:.1f}'}",
        f"re-prefill {_pct(stats.get('re_prefill_rate'))}",
        f"regret {_pct(stats.get('regret_ratio'))}",
    )
    head.add_row(
        f"pool {usage.get('used_blocks', '?')}/{usage.get('num_blocks', '?')} blocks",
        f"cached {usage.get('cached_blocks', '?')} (evictable {usage.get('evictable_blocks', '?')})",
        f"requests {usage.get('running', '?')} running, {usage.get('waiting', '?')} waiting",
        f"batch limit {usage.get('max_running_batch', '?')}"
        + (" (adaptive)" if usage.get("adaptive_batch") else ""),
        "",
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
    warning = thrashing_warning(stats)
    alert = [Text(warning, style="bold red")] if warning is not None else []
    return Group(*alert, head, Text(""), use, Text(""), *lines, Text("q quits", style="dim"))
