"""``python -m sage_cli``: the same as the ``sage`` command."""

from sage_cli.app import main

raise SystemExit(main())
