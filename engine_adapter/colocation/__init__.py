"""LLM + embedding colocation on one block pool (spec 004, issue 19): the controller side.

Pure Python and no clock of its own (time is passed in), so the engine
(`engine_adapter.serving.colocation`) and the simulator (`engine_adapter.sim.colocation`) run
the same code. Its modules, one layer each:

    records.py     the boundary records: SLOs, `ColocationParams`, `Quota`, `Decision`,
                   `Admission`, the views of requests (`LLMView`, `EmbeddingView`), `MemoryState`
    predictors.py  what the controller learns: output lengths, the embedding load
    admission.py   Algorithm 1 (LLM admission) and sage's admission of embedding batches
    quota.py       Algorithm 2: the quotas of the two classes (urgency, floors, smoothing)
    preemption.py  Algorithm 3: which requests to preempt
    controller.py  `ColocationController`, the facade the engine and the simulator call

It imports only the standard library and itself: never torch, `model`, `serving` or `sim`. The
workload generator of the study lives with the simulator (`engine_adapter.sim.colocation.workload`),
as it needs the simulator's cost model.
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
