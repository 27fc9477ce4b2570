"""``sage llm eviction explain --request ID``: a request's cache receipt for people.

The engine's answer (``GET /v1/cache/requests/{id}``, engine_adapter/cache/receipts.py) becomes
a summary line of what the request read per tier, wrote and left uncached, and a table with one
row per run of missed blocks and its reason; and the prompt-cache lines of ``eviction stats``.
Pure functions of the JSON: Rich is imported only when the receipt's table is built.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Group

__all__ = ["ACCOUNT_ROWS", "miss_text", "prompt_cache_lines", "receipt_view"]

_NAMES = {
    "first_use": "never written: first use",
    "explicit_mode": "never written: explicit mode, past the last breakpoint",
    "generated_not_stored": "never written: generated tokens not stored",
    "evicted": "evicted",
    "lapsed": "lifetime lapsed, then evicted",
    "dropped": "dropped",
    "other_salt": "cached under a different salt",
    "retokenised": "the same text, tokenised differently",
    "unknown": "unknown: beyond the window",
    "recomputed": "last token recomputed (its block is never read)",
    "partial_block": "partial block (only full blocks are cached)",
}


def _ago(at: Any) -> str:
    return f"{max(time.time() - float(at), 0.0):.3g} s ago" if isinstance(at, (int, float)) else "?"


def miss_text(miss: dict[str, Any]) -> str:
    """One run of missed blocks' reason, with its when, who and where."""
    reason = str(miss.get("reason"))
    text = _NAMES.get(reason, reason)
    if reason in ("evicted", "lapsed"):
        policy = str(miss.get("policy", "?")).upper()
        text += f" by {policy} {_ago(miss.get('at'))} (eviction #{miss.get('eviction_id')})"
        if reason == "lapsed":
            text += f"; its lifetime lapsed {_ago(miss.get('lapsed_at'))}"
    elif reason == "dropped":
        text += f" from {miss.get('tier', '?')} ({miss.get('why', '?')}) {_ago(miss.get('at'))}"
    elif reason == "other_salt":
        salt = miss.get("salt") or "no salt"
        text += f" ({salt}{', cached now' if miss.get('cached') else ', no longer cached'})"
    elif reason == "retokenised":
        text += f" (the first {miss.get('text_chars', '?')} characters match a recent prompt's)"
    elif reason in ("explicit_mode", "generated_not_stored"):
        text += f", freed {_ago(miss.get('at'))}"
    elif reason == "unknown" and miss.get("note"):
        text += f" ({miss['note']})"
    explanation = miss.get("explanation")
    if isinstance(explanation, dict) and explanation.get("explain") is not None:
        text += f"\n  why: {explanation['explain']}"
    return text


def receipt_view(answer: dict[str, Any]) -> Group:
    """The receipt: a summary line and the missed blocks' table."""
    from rich.console import Group  # Rich only when a table is built: `stats` stays light
    from rich.table import Table
    from rich.text import Text

    read = answer.get("read_tokens") or {}
    who = f"request {answer.get('id')}"
    if answer.get("tenant") is not None:
        who += f", tenant {answer['tenant']}"
    if answer.get("salt") is not None:
        who += f", salt {answer['salt']}"
    ttl = answer.get("retention_ttl_s")
    lifetime = "none asked" if ttl is None else "refused in part" if ttl == 0 else f"{ttl:g} s"
    if answer.get("retention_broken_tokens"):
        lifetime += f", {answer['retention_broken_tokens']} tokens of it broken (dropped before expiry)"
    summary = Text(
        f"{who}: {answer.get('prompt_tokens')} prompt tokens; read {answer.get('cached_tokens')} "
        f"(device {read.get('device', 0)}, host {read.get('host', 0)}, disk {read.get('disk', 0)}), "
        f"wrote {answer.get('written_tokens')}, uncached {answer.get('uncached_tokens')}; lifetime {lifetime}"
    )
    table = Table(title="missed blocks", title_justify="left")
    for column, justify in (("blocks", "right"), ("tokens", "right"), ("why", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for miss in answer.get("misses") or []:
        first, n = int(miss.get("first_block", 0)), int(miss.get("blocks", 0))
        span = str(first) if n == 1 else f"{first}-{first + n - 1}"
        table.add_row(span, str(miss.get("tokens")), miss_text(miss))
    if not answer.get("misses"):
        return Group(summary, Text("every block of its prompt was read from the cache"))
    return Group(summary, table)


_RETENTION_KEYS = (
    "retained_blocks",
    "retention_granted_blocks",
    "retention_refused_blocks",
    "retention_broken_blocks",
    "retention_expired_blocks",
)

ACCOUNT_ROWS = 20
"""Tenant-and-salt rows the stats block shows (the most prompt tokens first; --json has all)."""


def prompt_cache_lines(stats: dict[str, Any]) -> list[str]:
    """The stats block's prompt-cache lines: the retention counters (when any lifetime was asked)
    and, per tenant and salt, tokens read per tier and written and lifetimes granted/refused."""
    lines: list[str] = []
    keys = _RETENTION_KEYS
    if any(stats.get(k) for k in keys):
        lines.append(
            "  Retention: {} blocks retained, {} granted, {} refused, {} broken, {} expired".format(
                *(stats.get(k, 0) for k in keys)
            )
        )
    accounts = [a for a in stats.get("cache_accounts") or [] if isinstance(a, dict)]
    accounts.sort(key=lambda a: -int(a.get("prompt_tokens") or 0))
    for a in accounts[:ACCOUNT_ROWS]:
        who = f"tenant {a.get('tenant') or '-'}, salt {a.get('salt') or '-'}"
        lines.append(
            f"  Prompt Cache ({who}): {a.get('requests')} requests, {a.get('prompt_tokens')} prompt tokens, "
            f"read {a.get('read_device_tokens')} device / {a.get('read_host_tokens')} host / "
            f"{a.get('read_disk_tokens')} disk, wrote {a.get('written_tokens')}, lifetimes "
            f"{a.get('retention_granted_requests')} granted / {a.get('retention_refused_requests')} refused, "
            f"{a.get('retention_broken_tokens') or 0} tokens broken"
        )
    if len(accounts) > ACCOUNT_ROWS:
        lines.append(f"  ... {len(accounts) - ACCOUNT_ROWS} more tenant/salt rows (--json)")
    return lines
