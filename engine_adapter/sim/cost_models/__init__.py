"""The cost models shipped with sage, by name: YAML files of `CostModel` fields beside this module.

``--cost-model h100-llama-1b`` (and ``cost_model_path="h100-llama-1b"`` in the library) reads
``h100-llama-1b.yaml`` here; a path to a file of one's own works as before. The default model
(a 7B on one A100, `CostModel()`) serves the shipped Mooncake traces ten times slower than they
arrive, so their TTFTs measure a queue (`engine_adapter.sim.saturation`); these keep up:

    h100-llama-1b   a 1B model on one H100: keeps up with both shipped Mooncake traces as
                    recorded (a 3B on the same GPU does not: its decode steps fall behind)

Each file says how its coefficients were derived. Paths only: imports nothing of the simulator
(the CLI resolves a name before it loads it).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIPPED_COST_MODELS", "shipped_cost_model"]

SHIPPED_COST_MODELS = ("h100-llama-1b",)
"""The names of the shipped cost models (each a ``NAME.yaml`` beside this module)."""


def shipped_cost_model(name: str) -> Path | None:
    """The file of the shipped cost model `name`, or None when no shipped model has that name."""
    key = name.strip().lower().removesuffix(".yaml")
    return Path(__file__).with_name(f"{key}.yaml") if key in SHIPPED_COST_MODELS else None
