"""LLM + embedding colocation on one block pool (spec 004, issue 19): pure Python, no torch.

The records (`records`), the predictors (`predictors`), Algorithm 1 (`admission`),
Algorithm 2 (`quota`), Algorithm 3 over requests (`preemption`) and the facade that the engine
and the simulator call (`ColocationController`, `controller`).
"""

from __future__ import annotations

from engine_adapter.colocation.controller import SYSTEMS, ColocationController, parse_mode
from engine_adapter.colocation.predictors import EmbeddingLoadForecaster, OutputLengthPredictor
from engine_adapter.colocation.quota import smooth_adjust
from engine_adapter.colocation.records import (
    LLMSLO,
    Admission,
    ColocationParams,
    Decision,
    EmbeddingSLO,
    EmbeddingView,
    LLMView,
    MemoryState,
    Quota,
)

__all__ = [
    "LLMSLO",
    "SYSTEMS",
    "Admission",
    "ColocationController",
    "ColocationParams",
    "Decision",
    "EmbeddingLoadForecaster",
    "EmbeddingSLO",
    "EmbeddingView",
    "LLMView",
    "MemoryState",
    "OutputLengthPredictor",
    "Quota",
    "parse_mode",
    "smooth_adjust",
]
