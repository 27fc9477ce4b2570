"""The prompt cache's per tenant-and-salt counters on /metrics (issue 51 item 5).

`AccountCounters` turns the cache's totals (`CacheManager.cache_accounts`: at most `MAX_TENANTS`
tenant-and-salt rows, the rest together) into ``sage:prompt_cache_account_tokens_total{tenant,
salt, kind}`` and ``sage:prompt_cache_account_requests_total{tenant, salt, event}``, advancing
each by what grew since the last scrape; the label sets are as bounded as the rows. Imports
prometheus_client only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import Counter

__all__ = ["ACCOUNT_SERIES", "AccountCounters"]

ACCOUNT_SERIES = (
    ("prompt_tokens", True, "prompt"),
    ("read_device_tokens", True, "read_device"),
    ("read_host_tokens", True, "read_host"),
    ("read_disk_tokens", True, "read_disk"),
    ("written_tokens", True, "written"),
    ("retention_broken_tokens", True, "retention_broken"),
    ("requests", False, "admitted"),
    ("retention_granted_requests", False, "retention_granted"),
    ("retention_refused_requests", False, "retention_refused"),
)
"""Each total's field (`receipts.TOTAL_FIELDS`), whether it is a token `kind` (else a request
`event`), and its label value."""


class AccountCounters:
    """The two counters and what each series has counted so far.

    Args:
        tokens: ``sage:prompt_cache_account_tokens_total``.
        requests: ``sage:prompt_cache_account_requests_total``.
    """

    def __init__(self, tokens: Counter, requests: Counter) -> None:
        self._tokens, self._requests = tokens, requests
        self._counted: dict[tuple[str, str, str], int] = {}  # (tenant, salt, field) -> counted

    def advance(self, accounts: Sequence[Mapping[str, Any]]) -> None:
        """Advance every series to the totals `accounts` give (None labelled ``-``)."""
        counted = self._counted
        for row in accounts:
            tenant = "-" if row["tenant"] is None else str(row["tenant"])
            salt = "-" if row["salt"] is None else str(row["salt"])
            for field, is_tokens, value in ACCOUNT_SERIES:
                key, now = (tenant, salt, field), int(row[field])
                before = counted.get(key, 0)
                if now <= before:
                    continue
                if is_tokens:
                    self._tokens.labels(tenant=tenant, salt=salt, kind=value).inc(now - before)
                else:
                    self._requests.labels(tenant=tenant, salt=salt, event=value).inc(now - before)
                counted[key] = now
