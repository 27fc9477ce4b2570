"""The engine's answers for people: the statistics block, eviction log lines, a swap, the policies.

Pure functions of the engine's JSON (docs/architecture.md, "Control API"), so the tests feed them
recorded answers too; the commands in `sage_cli.eviction.commands` print what they return. Rich is
imported only when a table is built.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from sage_cli.eviction.ages_view import age_lines, regret_line, thrashing_warning
from sage_cli.eviction.quota import quota_lines
from sage_cli.eviction.receipts_view import prompt_cache_lines

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "eviction_log_lines",
    "group_line",
    "line_groups",
    "policies_table",
    "render_event",
    "render_eviction",
    "render_stats",
    "render_swap",
    "stats_block",
]


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


def _millis(value: Any) -> str:
    x = _number(value)
    return "n/a" if x is None else f"{x:.2f}ms"


def _tier_load_text(tier: dict[str, Any]) -> str:
    """The tier line's tail: its timed loads' p50/p99 and its prefetches, when it has any."""
    text = ""
    if _number(tier.get("loads")):
        p50, p99 = _millis(tier.get("load_time_p50_ms")), _millis(tier.get("load_time_p99_ms"))
        text += f", load p50 {p50} p99 {p99}"
    if _number(tier.get("prefetched_blocks")):
        used = _count(tier.get("prefetch_hits"))
        text += f", {_count(tier.get('prefetched_blocks'))} prefetched ({used} used)"
    return text


def _tier_lines(tiers: list[Any], stats: dict[str, Any]) -> list[str]:
    """One line per KV tier under the pool (host, disk): use, policy and what moved."""
    lines = []
    for tier in tiers:
        if not isinstance(tier, dict):
            continue
        lines.append(
            f"  {str(tier.get('tier', '?')).capitalize()} Tier ({tier.get('policy', '?')}): "
            f"{_count(tier.get('used_blocks'))} / {_count(tier.get('capacity_blocks'))} blocks, "
            f"{_count(tier.get('hits'))} hits, {_count(tier.get('demotions'))} demotions, "
            f"{_count(tier.get('promotions'))} promotions, {_count(tier.get('drops'))} drops"
            + _tier_load_text(tier)
        )
    if stats.get("prefetched_blocks"):
        lines.append(
            f"  Prefetched: {_count(stats.get('prefetched_blocks'))} blocks, "
            f"{_count(stats.get('prefetch_hits'))} used"
        )
    return lines


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
    lines += [line for line in (regret_line(stats), thrashing_warning(stats)) if line is not None]
    lines += age_lines(stats)
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
    tiers = stats.get("tiers")
    lines += _tier_lines(tiers, stats) if isinstance(tiers, list) and tiers else []
    lines += prompt_cache_lines(stats)
    token = stats.get("token_eviction")
    if isinstance(token, dict):
        lines += _token_lines(token)
    colocation = stats.get("colocation")
    if isinstance(colocation, dict):
        lines += _colocation_lines(colocation)
    return "\n".join([*lines, *quota_lines(stats)])


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
    titles = (
        ("tokens_evicted", "Tokens By Policy"),
        ("by_reason", "Compressions By Reason"),
        ("attention_fallbacks", "Recency Fallbacks By Policy"),  # no attention to score by
    )
    for key, title in titles:
        counts = token.get(key)
        if isinstance(counts, dict) and counts:
            lines.append(f"  {title}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return lines


def stats_block(stats: dict[str, Any], verbose: bool) -> str:
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
    if kind == "compress" and event.get("block"):  # a cached prefix compressed instead of evicted
        chooser = str(event.get("chosen_by") or "?").upper()
        return (
            f"{stamp} COMPRESSION: Cached prefix ending {str(event['block'])[:8]}... "
            f"({_plural(len(event.get('blocks') or []), 'block')}) kept {event.get('tokens_after', '?')} of "
            f"{event.get('tokens_before', '?')} tokens ({policy}, chosen by "
            f"{chooser}), freed {_plural(event.get('blocks_freed'), 'block')}"
        )
    if kind == "drop_compressed":
        blocks = event.get("blocks") or []
        first = f" {str(blocks[-1])[:8]}..." if blocks else ""
        return (
            f"{stamp} EVICTION: Compressed prefix{first} dropped ({event.get('why', '?')}), "
            f"freed {_plural(event.get('blocks_freed'), 'block')}"
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


def _victims_text(victims: list[dict[str, Any]]) -> str:
    """The victims of one eviction call, by sequence: ``Sequence 123``, ``Sequences 123 (2
    blocks), 124``, ``3 cached blocks``; at most four sequences named, the rest counted."""
    by_sequence: dict[Any, int] = {}
    unowned = 0
    for event in victims:
        sequence_id = event.get("sequence_id")
        if sequence_id is None:
            unowned += 1
        else:
            by_sequence[sequence_id] = by_sequence.get(sequence_id, 0) + 1
    parts = [f"{sid}" + (f" ({n} blocks)" if n > 1 else "") for sid, n in list(by_sequence.items())[:4]]
    if len(by_sequence) > 4:
        parts.append(f"{len(by_sequence) - 4} more")
    named = ""
    if parts:
        named = ("Sequence " if len(by_sequence) == 1 else "Sequences ") + ", ".join(parts)
    if unowned:
        cached = _plural(unowned, "cached block")
        named = f"{named} and {cached}" if named else cached.capitalize()
    return named or "Nothing"


def render_eviction(
    victims: list[dict[str, Any]], freed: dict[str, Any] | None, *, tz: dt.tzinfo | None = None
) -> str:
    """One eviction call on one line: its victims by sequence, the policy, why, the oldest
    victim's last access, and what the call freed (the module spec's two lines in one).

    ``[2026-01-02 10:15:32] EVICTION: Sequence 123 evicted (LRU, alloc, last_access=1735797332.1);
    freed 1 block, total freed: 127 blocks``

    Args:
        victims: The call's ``evict`` events (possibly none, or only the last of them when a
            tail cut the call).
        freed: Its ``freed`` event; None when the log ends before it.
        tz: The time zone of the timestamp; the local one by default.
    """
    first = victims[0] if victims else (freed or {})
    stamp = f"[{_timestamp(first.get('ts'), tz)}]"
    policy = str(first.get("policy") or (freed or {}).get("policy") or "?").upper()
    reason = first.get("reason") or (freed or {}).get("reason")
    accesses = [x for x in (_number(v.get("last_access")) for v in victims) if x is not None]
    details = [policy, *([str(reason)] if reason else [])]
    if accesses:
        details.append(f"last_access={min(accesses):.1f}")
    line = f"{stamp} EVICTION: {_victims_text(victims)} evicted ({', '.join(details)})"
    if freed is not None:
        line += (
            f"; freed {_plural(freed.get('blocks_freed'), 'block')}, "
            f"total freed: {_plural(freed.get('total_freed'), 'block')}"
        )
    return line


def line_groups(events: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The events of the eviction log, grouped as its text shows them: an eviction call (its
    ``evict`` events and the ``freed`` event that ends it) is one group, any other event its own.
    Lazy: a call's group comes out as soon as its ``freed`` event goes in."""
    victims: list[dict[str, Any]] = []
    for event in events:
        kind = event.get("event")
        if kind == "evict":
            victims.append(event)
            continue
        if kind == "freed":
            yield [*victims, event]
            victims = []
            continue
        if victims:
            yield victims
            victims = []
        yield [event]
    if victims:
        yield victims


def group_line(group: list[dict[str, Any]], *, tz: dt.tzinfo | None = None) -> str:
    """The text line of one group of `line_groups`."""
    last = group[-1]
    if last.get("event") == "freed":
        return render_eviction(group[:-1], last, tz=tz)
    if last.get("event") == "evict":
        return render_eviction(group, None, tz=tz)
    return render_event(last, tz=tz)


def eviction_log_lines(events: Iterable[dict[str, Any]], *, tz: dt.tzinfo | None = None) -> Iterator[str]:
    """The eviction log for people: one line per eviction call, one per other event (see
    `line_groups`), so ``logs --follow`` prints each eviction as it happens."""
    for group in line_groups(events):
        yield group_line(group, tz=tz)


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


_YEAR = re.compile(r"\b(?:19|20)\d\d\b")


def short_source(paper: str) -> str:
    """A paper as the policies table shows it: its authors and where and when (``Megiddo and
    Modha, FAST 2003``), the title left to ``--json`` and the README, so that a row is not five
    lines of title. Another kind of source: its first part and year (``SGLang FILOStrategy,
    2024``)."""
    parts = [p.strip() for p in paper.split(";")[0].split(", ")]
    if len(parts) < 3 or not _YEAR.search(parts[-1]) or "(" in parts[-1] or ")" in parts[-1]:
        year = _YEAR.findall(paper.split(";")[0])
        return f"{parts[0]}, {year[-1]}" if year and year[-1] not in parts[0] else parts[0]
    # the authors run to the part that names the last of them ("Aho, Denning and Ullman")
    last = next((i for i, p in enumerate(parts[:3]) if " and " in p or "et al." in p), 0)
    return f"{', '.join(parts[: last + 1])}, {parts[-1]}"


def policies_table(answer: dict[str, Any]) -> Table:
    """The installed policies: name, idea, params with defaults, source; the one an engine runs
    marked (``answer["engine"]`` says which engine, None when none answered)."""
    from rich.table import Table

    active = answer.get("active")
    # As wide as the terminal, the idea taking most of it: a row is as tall as its idea.
    table = Table(title="Eviction policies", title_justify="left", expand=True)
    table.add_column("", width=1, no_wrap=True)
    table.add_column("Policy", no_wrap=True)
    table.add_column("Idea", ratio=5)
    table.add_column("Params (defaults)", ratio=2)
    table.add_column("Source", ratio=3)
    for policy in answer.get("policies") or []:
        name = str(policy.get("name", "?"))
        offline = " (simulation only)" if policy.get("offline") else ""
        table.add_row(
            "*" if name == active else "",
            name,
            str(policy.get("idea") or "") + offline,
            _params_text(policy.get("params")),
            short_source(str(policy.get("paper") or "")),
        )
    if active:
        table.caption = f"* active: {active} (the engine on {answer.get('engine') or '?'})"
    elif "engine" in answer:
        table.caption = "no engine running: * would mark the policy one runs"
    table.caption_justify = "left"
    return table
