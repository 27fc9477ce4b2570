"""Print the README's policy table from the registry (so README cannot drift from the code).

python scripts/policy_table.py            # print the table
python scripts/policy_table.py --check    # exit 1 when README.md's table differs
"""

from __future__ import annotations

import sys
from pathlib import Path

from sage_eviction import available_policies, get_policy_class, policy_params
from sage_eviction.registry import policy_idea

BEGIN = "<!-- policy-table:begin -->"
END = "<!-- policy-table:end -->"


def policy_table() -> str:
    rows = [
        "| policy | idea | params (defaults) | source |",
        "| --- | --- | --- | --- |",
    ]
    for name in available_policies():
        cls = get_policy_class(name)
        idea = policy_idea(cls).replace("|", "\\|")
        params = ", ".join(
            f"`{p.name}={p.default!r}`" for p in policy_params(cls).values() if p.name != "capacity"
        )
        if cls.needs_capacity:
            params = ", ".join(filter(None, ["`capacity` (blocks, required)", params]))
        if cls.offline:
            idea += " (offline: simulation only)"
        rows.append(f"| `{name}` | {idea} | {params or '-'} | {cls.paper} |")
    return "\n".join(rows)


def main() -> int:
    table = f"{BEGIN}\n{policy_table()}\n{END}"
    if "--check" in sys.argv:
        readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
        if table not in readme:
            print("README.md's policy table is stale: run `python scripts/policy_table.py --write`")
            return 1
        return 0
    if "--write" in sys.argv:
        path = Path(__file__).resolve().parent.parent / "README.md"
        text = path.read_text(encoding="utf-8")
        start, end = text.find(BEGIN), text.find(END)
        if start == -1 or end == -1:
            print(f"README.md has no {BEGIN} ... {END} block")
            return 1
        path.write_text(text[:start] + table + text[end + len(END) :], encoding="utf-8")
        return 0
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
