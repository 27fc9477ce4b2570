"""Where an engine's files live: the engine side's one definition of ``$SAGE_HOME`` and names.

    $SAGE_HOME                      default ~/.sage
    ├── run/<name>.sock             the control socket (mode 0600), the pid file beside it
    └── logs/<name>/                engine.log, evictions.jsonl

Standard library only, so that the cache core and the serving config both use it. The CLI keeps
its own copy in ``sage_cli/paths.py`` because its light commands must not import
``engine_adapter`` at all; tests/test_engine_config.py checks that the two agree.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["DEFAULT_NAME", "ENGINE_NAME", "default_log_dir", "default_socket", "is_engine_name", "sage_home"]

DEFAULT_NAME = "default"
# An engine name becomes a file name: letters, digits, '.', '_', '-', at most 64, not hidden.
ENGINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def sage_home() -> Path:
    """``$SAGE_HOME``, or ``~/.sage``."""
    home = os.environ.get("SAGE_HOME")
    return Path(home).expanduser() if home else Path.home() / ".sage"


def is_engine_name(name: str) -> bool:
    """Whether `name` can name an engine (and so a socket, a pid file and a log folder)."""
    return bool(ENGINE_NAME.match(name))


def default_socket(name: str) -> Path:
    """``$SAGE_HOME/run/<name>.sock``."""
    return sage_home() / "run" / f"{name}.sock"


def default_log_dir(name: str) -> Path:
    """``$SAGE_HOME/logs/<name>``."""
    return sage_home() / "logs" / name
