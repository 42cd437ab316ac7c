"""The ``model`` stage of the scenario rules (``rules/model.py``, ``rules/multimodal.py``), remembered for the
scenario fields those rules read, so that a new scenario differing elsewhere is not checked again.

The rules read the scenario's keys through ``rules.ScenarioView`` plus the model, its Linear modules, the LoRA
adapters and the images per sample, all resolved from the scenario. A scenario that passed is remembered by
every field but an explicit list the rules and those resolutions never read (as ``engine/caches/parts_cache``), so a
field added to ``Scenario`` later is part of the key until someone shows the rules do not read it. A scenario
that breaks a rule is not remembered: it raises every time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import fields
from operator import attrgetter
from typing import Any

from memsim_widget.scenario import ParallelConfig, Scenario

#: Scenario fields no ``model`` or ``multimodal`` rule, and none of the view's resolved keys, reads.
MODEL_RULES_IGNORE = frozenset(
    {
        "micro_batch_size",
        "grad_accum_steps",
        "attention",
        "loss",
        "output_lifetime",
        "ssm_kernel",
        "activation_offloading",
        "padding",
        "cuda_lazy_loading",
        "optimizer_in_backward",
        "zero_grad",
        "gpu",
    }
)
#: ``parallel`` fields they never read: the data-parallel layout of the states.
MODEL_RULES_IGNORE_PARALLEL = frozenset(
    {"dp", "zero", "offload", "reshard_after_forward", "sequence_parallel"}
)

_FIELDS = attrgetter(*(f.name for f in fields(Scenario) if f.name not in MODEL_RULES_IGNORE | {"parallel"}))
_PARALLEL = attrgetter(*(f.name for f in fields(ParallelConfig) if f.name not in MODEL_RULES_IGNORE_PARALLEL))

#: Bound of the scenarios remembered (least recently used dropped first).
CACHE_SIZE = 4096

_passed: OrderedDict[tuple[Any, ...], None] = OrderedDict()
#: Guards ``_passed``: the widget estimates on a worker thread while the kernel's thread may estimate too.
_LOCK = threading.Lock()


def model_rules_key(sc: Scenario) -> tuple[Any, ...]:
    """The fields of ``sc`` the ``model`` stage rules depend on."""
    return (_FIELDS(sc), _PARALLEL(sc.parallel))


def check_once(sc: Scenario, check: Callable[[], None]) -> None:
    """Run ``check`` (which raises on a broken rule) unless a scenario with the same ``model_rules_key`` passed."""
    key = model_rules_key(sc)
    with _LOCK:
        if key in _passed:
            _passed.move_to_end(key)
            return
    check()
    with _LOCK:
        _passed[key] = None
        while len(_passed) > CACHE_SIZE:
            _passed.popitem(last=False)


def cache_clear() -> None:
    """Forget every scenario that passed (benchmarks measuring a cold engine)."""
    with _LOCK:
        _passed.clear()
