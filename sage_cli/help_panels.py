"""Help grouped into panels for the commands with many options (``engine start``, ``benchmark``).

Each option gets a panel by its parameter name (Typer's ``rich_help_panel``, so Typer's Rich help
would show the same panels); the CLI prints plain help (``rich_markup_mode=None``: no Rich import
on the light commands), so `PanelledCommand` also lists the options panel by panel there, in the
order the command names them. Issue 48: ``engine start --help`` was 186 lines in one flat list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from typer.core import TyperCommand

__all__ = ["PanelledCommand", "panelled"]


class PanelledCommand(TyperCommand):
    """A Typer command whose ``--help`` lists its options in panels (`panels`: parameter name ->
    panel title; an option in none stays under "Options", an argument under "Arguments")."""

    panels: Mapping[str, str] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name in self.panels and not getattr(param, "rich_help_panel", None):
                param.rich_help_panel = self.panels[param.name]  # type: ignore[attr-defined]

    def format_options(self, ctx: Any, formatter: Any) -> None:  # Typer's own (vendored) Click types
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            plain = "Arguments" if param.param_type_name == "argument" else "Options"
            sections.setdefault(getattr(param, "rich_help_panel", None) or plain, []).append(record)
        # Arguments first, then the panels in the order `panels` names them, then the rest.
        order = ["Arguments", *dict.fromkeys(self.panels.values())]
        rank = {title: i for i, title in enumerate(order)}
        for title, records in sorted(sections.items(), key=lambda item: rank.get(item[0], len(order))):
            with formatter.section(title):
                formatter.write_dl(records)


def panelled(name: str, panels: Mapping[str, str]) -> type[PanelledCommand]:
    """The command class of a command whose options sit in `panels` (parameter name -> title)."""
    return type(f"{name}Command", (PanelledCommand,), {"panels": dict(panels)})
