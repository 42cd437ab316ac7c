"""The engine estimates from several threads at once: the widget's searches run on a worker thread while the
kernel's thread estimates too, and the engine's module-level caches (the last streams built, the model rules that
passed) are shared by both. A CI run lost one to a race (a KeyError evicting ``alloc_stream._STREAMS``)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from memsim_widget.engine.caches import model_rules_cache
from memsim_widget.engine.counters import alloc_stream
from memsim_widget.scenario import Scenario

ROUNDS = 4000


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads every microsecond (the interpreter's default is 5 ms) so that races show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _on_threads(work: Callable[[int], None], n: int = 4) -> list[BaseException]:
    """Run ``work(t)`` on ``n`` threads at once; the errors they raised."""
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            work(t)
        except BaseException as e:  # noqa: BLE001 - any error of a thread fails the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return errors


def test_the_last_streams_built_are_shared_safely(busy_switching: None, monkeypatch: Any) -> None:
    made: list[tuple[Any, ...]] = []

    def rank_stream(ctx: Any, stage: Any) -> tuple[Any, ...]:
        made.append(ctx)
        return ctx

    monkeypatch.setattr(alloc_stream, "rank_stream", rank_stream)
    alloc_stream.cache_clear()

    def work(t: int) -> None:
        for k in range(ROUNDS):
            key = (t, k % 5)
            assert alloc_stream.built_stream(key, key, None) == key  # each key's own stream, built or reused

    assert _on_threads(work) == []
    assert len(alloc_stream._STREAMS) <= alloc_stream._STREAMS_KEPT
    alloc_stream.cache_clear()


def test_the_model_rules_that_passed_are_shared_safely(busy_switching: None, monkeypatch: Any) -> None:
    monkeypatch.setattr(model_rules_cache, "CACHE_SIZE", 3)
    scenarios = [Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {"dp": d}}) for d in range(1, 9)]
    checked: list[int] = []
    model_rules_cache.cache_clear()

    def work(t: int) -> None:
        for k in range(ROUNDS // 4):
            model_rules_cache.check_once(scenarios[(k + t) % len(scenarios)], lambda: checked.append(1))

    assert _on_threads(work) == []
    assert checked  # the checks ran (more than once per scenario: the cache holds 3 of 8)
    model_rules_cache.cache_clear()
