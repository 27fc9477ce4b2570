"""The trace-driven simulator: workloads (`workloads`) and the virtual clock's cost model (`cost_model`).

Importing this package imports no submodule and never torch; import what you need, e.g.
``from engine_adapter.sim.workloads import read_mooncake``.
"""

from __future__ import annotations

__all__: list[str] = []
