"""Shared fixtures: small models whose arithmetic is easy to check by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The engine-vs-trace case matrices (fidelity_cases, fidelity_parallel_cases) are test data, not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}


@pytest.fixture
def tiny_llama() -> dict:
    return dict(TINY_LLAMA)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say when the slow real-trace tests are left out (pyproject's default), and how to run them."""
    if config.getoption("markexpr") == "not slow":
        return "slow real-trace tests left out: `pytest -m ''` or `scripts/dev test` runs them"
    return None
