"""A calibrated model's first estimate, run off the widget's update: the "calibrating..." state.

A model type no family models is calibrated from about a dozen tiny fake-tensor traces the first time one of its
recipes is estimated (``memsim_widget.calibrate``: ~30 s for a 6B shape), then cached. Run inside the update of
an edit from the front end, that would block the kernel. Instead the update asks ``pending_fit`` first and, when a
fit would be traced, hands the estimate to this controller: a ``BackgroundJob`` computes it while the
``calibration`` trait says ``running`` (the front end shows "calibrating..." in place, over the last result,
which stays); when it ends, the scenario is applied again, now from the cache (milliseconds), or its error shown
as any rejected edit's is. A newer edit supersedes a running calibration: its outcome is then not published
(the fit still lands in the cache). Python's own ``set`` / ``scenario =`` still block and raise, as documented.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from memsim_widget.errors import ScenarioError
from memsim_widget.frozen import FrozenDict
from memsim_widget.scenario import Scenario
from memsim_widget.widget.background import BackgroundJob, JobSlot, error_text

if TYPE_CHECKING:
    from memsim_widget.engine.estimate import Estimate
    from memsim_widget.widget.host import WidgetHost


def resolves_at_once(model: Any) -> bool:
    """Whether the architecture of ``model`` is had without building a model on the meta device or tracing: a
    preset, a family's model type, an architecture already resolved on this model object, or a model type (or
    file) refused at once. A model transformers may know otherwise is resolved in the background: the first
    build of a calibrated model takes seconds, the kernel must not wait for it."""
    from memsim_widget.architecture.types import FAMILIES
    from memsim_widget.calibrate import maybe_known_to_transformers
    from memsim_widget.catalog.models import PRESETS, resolve_model_config

    if isinstance(model, str) and model in PRESETS:
        return True
    if isinstance(model, FrozenDict) and "architecture" in model.__dict__.get("_derived", {}):
        return True
    try:
        config = model if isinstance(model, Mapping) else resolve_model_config(model)
    except ScenarioError:  # the estimate names it, at once
        return True
    model_type = config.get("model_type")
    return (
        not isinstance(model_type, str)
        or model_type in FAMILIES
        or not maybe_known_to_transformers(model_type)
    )


def pending_fit(sc: Scenario) -> bool:
    """Whether estimating ``sc`` would trace or build a model: a calibrated model not resolved yet
    (``resolves_at_once``), or one whose fit for this recipe is not made yet."""
    from memsim_widget.catalog.models import architecture_for
    from memsim_widget.engine.activations.calibrated import recipe_key

    if not resolves_at_once(sc.model):
        return True
    try:
        arch = architecture_for(sc.model)
    except ScenarioError:  # the estimate names it, at once
        return False
    source = arch.facts.calibration
    return source is not None and not source.cached(recipe_key(arch, sc))


def run_estimate(sc: Scenario) -> Estimate:
    """The estimate the background job computes (the engine's; tests put a stub in its place)."""
    from memsim_widget.engine.core import estimate

    return estimate(sc)


class CalibrationController:
    """The widget's (its ``WidgetHost``'s) background calibration: one job at a time, the newest edit's."""

    def __init__(self, host: WidgetHost) -> None:
        """The calibration slot of a new widget (idle)."""
        self.host = host
        self._slot: JobSlot[Any] = JobSlot(host._lock, "memsim-calibrate")
        self._t0 = 0.0

    @staticmethod
    def initial() -> dict[str, Any]:
        """The ``calibration`` trait when nothing is calibrating: ``state`` idle | running | done | error, the
        ``model`` it is for, its ``error`` and the ``seconds`` it took."""
        return {"state": "idle", "model": "", "error": "", "seconds": 0.0}

    @property
    def job(self) -> BackgroundJob[Any] | None:
        """The current calibration job (finished or not), None before the first."""
        return self._slot.job

    @staticmethod
    def needed(sc: Scenario) -> bool:
        """Whether an edit to ``sc`` goes to the background (``pending_fit``)."""
        return pending_fit(sc)

    def start(self, sc: Scenario, data: dict[str, Any], explicit: frozenset[str]) -> None:
        """Estimate ``sc`` in the background (under the lock); ``data`` is re-applied when it ends."""
        from memsim_widget.charts import model_label

        self._t0 = time.perf_counter()
        work: Callable[[BackgroundJob[Any]], Any] = lambda job: run_estimate(sc)  # noqa: E731
        self._slot.start(work, self._finish, subject=(data, explicit))
        state = {**self.initial(), "state": "running", "model": model_label(sc.model)}
        self.host._publish("calibration", state)

    def supersede(self) -> None:
        """A newer edit needs no calibration (under the lock): a running one's outcome is dropped."""
        if self._slot.running:
            self._slot.job = None
        if self.host._trait("calibration")["state"] == "running":
            self.host._publish("calibration", self.initial())

    def _finish(self, job: BackgroundJob[Any], est: Any, error: BaseException | None) -> None:
        """Under the lock, for the current job: apply the scenario (its fit now cached) or show the error."""
        host = self.host
        if host._closed:
            return
        data, explicit = job.subject
        seconds = round(time.perf_counter() - self._t0, 1)
        state = host._trait("calibration")
        if error is None:
            host._publish("calibration", {**state, "state": "done", "seconds": seconds})
            # not estimated again here; the scaling view in its own job: the lock is not held for it
            host._submit(data, relative=False, explicit=explicit, ready=est, defer_scaling=True)
            return
        exc = error if isinstance(error, ScenarioError) else ScenarioError("model", error_text(error))
        host._publish("calibration", {**state, "state": "error", "error": str(exc), "seconds": seconds})
        host._reject(data, exc)
