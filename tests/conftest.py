"""Shared fixtures: small models whose arithmetic is easy to check by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The engine-vs-trace case matrices (fidelity_cases, fidelity_parallel_cases) are test data, not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
import fidelity_cases  # noqa: E402

TINY_LLAMA = fidelity_cases.LLAMA  # h=256, I=688, 8 heads, 4 kv heads, 4 layers, V=1000, untied


@pytest.fixture
def tiny_llama() -> dict:
    return dict(TINY_LLAMA)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say when the slow real-trace tests are left out (pyproject's default), and how to run them."""
    if config.getoption("markexpr") == "not slow":
        return "slow real-trace tests left out: `pytest -m ''` or `scripts/dev test` runs them"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """One directory per test session for ``fresh_interpreter``'s snippet results, made by the controlling
    process before the xdist workers start (they inherit the variable), removed when the session ends."""
    import os
    import tempfile

    from fresh_interpreter import RESULTS_ENV

    if hasattr(config, "workerinput") or os.environ.get(RESULTS_ENV):
        return
    path = tempfile.mkdtemp(prefix="memsim-snippets-")
    os.environ[RESULTS_ENV] = path
    config._memsim_snippets = path  # type: ignore[attr-defined]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After each test, collect and leave what survives out of later garbage collections (``gc.freeze``): torch,
    transformers, the modules a test imported lazily (Dynamo, Inductor, peft) and the caches, alive for the rest
    of the process. Each trace starts with a full collection (``trace.tracker``), which otherwise walks that whole
    heap again, about half a second a trace on a 2-core CPU (a quarter of the suite's time went to collections);
    now it walks what the tests made since. Garbage is collected as before (nothing is frozen before a collection
    frees what is unreachable)."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    import os
    import shutil

    from fresh_interpreter import RESULTS_ENV

    path = getattr(config, "_memsim_snippets", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(RESULTS_ENV, None)
