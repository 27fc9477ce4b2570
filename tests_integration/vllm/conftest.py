"""vLLM integration tests: run with the vLLM venv's python (scripts/integration_venvs.sh vllm)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: starts a real vLLM engine (minutes on 2 CPU cores)")
