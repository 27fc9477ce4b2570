"""Reading a `PolicyBridge` event log (SAGE_EVICTION_LOG) and replaying it through a fresh policy.

The replay is the check that an engine's evictions were the sage policy's choices: the engine
process wrote every cache event it gave the policy and every victim the policy returned; a new
policy built from the same spec, fed the same events, must choose the same victims at every
eviction, and the blocks the engine actually evicted (its own `engine_evict` lines) must be
those victims, in order.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from sage_eviction import EntryMeta, create_policy


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bridges(events: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The events of each bridge (pid, bridge id), in order."""
    out: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in events:
        out.setdefault((event["pid"], event["bridge"]), []).append(event)
    return out


def replay(events: list[dict[str, Any]]) -> list[Hashable]:
    """Feed one bridge's events to a fresh policy; assert each eviction chooses the logged
    victims; return every victim in order."""
    start = events[0]
    assert start["op"] == "start", start
    policy = create_policy(start["spec"], start["capacity"])
    victims: list[Hashable] = []
    metas: dict[Hashable, EntryMeta] = {}
    for event in events[1:]:
        op = event["op"]
        if op == "insert":
            meta = EntryMeta(
                size=event["size"],
                cost=event["cost"],
                created_at=event["created_at"],
                last_access=event["last_access"],
                hits=event["hits"],
            )
            metas[event["key"]] = meta
            policy.insert(event["key"], meta, evictable=event["evictable"])
        elif op == "access":
            policy.access(event["key"], event["now"])
        elif op == "evictable":
            policy.set_evictable(event["key"], event["evictable"])
        elif op == "remove":
            policy.remove(event["key"])
        elif op == "prepare_insert":
            policy.prepare_insert(event["key"])
        elif op == "clear":
            policy = create_policy(start["spec"], start["capacity"])
        elif op == "evict":
            shielded = [k for k in event["protected"] if policy.is_evictable(k)]
            for key in shielded:
                policy.set_evictable(key, False)
            chosen = policy.evict(event["n"])
            for key in shielded:
                policy.set_evictable(key, True)
            assert chosen == event["victims"], (
                f"replayed eviction chose {chosen}, the engine's policy {event}"
            )
            victims.extend(chosen)
        elif op == "evict_eligible":  # refused victims go back in, as the bridge does
            chosen, refused = [], []
            while len(chosen) < event["n"] and policy.num_evictable:
                (key,) = policy.evict(1)
                if key in event["refused"]:
                    refused.append(key)
                    policy.insert(key, metas[key], evictable=False)
                else:
                    chosen.append(key)
            for key in refused:
                policy.set_evictable(key, True)
            assert (chosen, refused) == (event["victims"], event["refused"]), event
            victims.extend(chosen)
    return victims


def engine_evictions(events: list[dict[str, Any]]) -> list[Hashable]:
    return [e["key"] for e in events if e["op"] == "engine_evict"]
