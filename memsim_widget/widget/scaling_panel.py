"""The "how it scales" view (the scaling chart and ``result["scaling"]``), computed off the update of a front-end edit.

The view estimates the scenario again at up to 22 stops (``charts.scaling_data``: 11 micro-batches, 11 sequence
lengths; memoised per scenario with the moved axis factored out, so a micro-batch move still costs the 11 new
lengths): 10 to 30 ms each for a new shape, several times the update's own estimate. Run inside the update of an
edit from the front end, it would hold the kernel (and the widget's lock) for a third of a second or more. So the
update publishes the verdict, peaks, breakdown, table and time chart of its estimate at once, and hands the
scaling view to this controller: when every curve it needs is memoised (a headroom change, a value seen before)
the view is built in place, in a millisecond; otherwise a ``BackgroundJob`` computes it while ``result["scaling"]``
is ``SCALING_PENDING`` (the front end shows the previous chart marked "updating", and no largest micro-batch
or sequence: the previous scenario's would be wrong for this one). When the job ends, its view is published if
its estimate and headroom are still the widget's; a later edit supersedes it (the job stops at its next stop,
``charts.ScalingCancelled``, and publishes nothing; it is paused as soon as the edit's estimate starts, and
restarted if that edit is rejected). Python's own ``set`` / ``scenario =`` and the constructor
compute the view in place, as before: the traits are complete when they return (``MemSim.wait_scaling`` waits
for a front-end edit's job).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memsim_widget import charts as charts_mod
from memsim_widget.widget.background import BackgroundJob, JobSlot, error_text
from memsim_widget.widget.result import scaling_summary

if TYPE_CHECKING:
    from memsim_widget.engine.estimate import Estimate
    from memsim_widget.widget.host import WidgetHost

#: A scaling view: ``result["scaling"]`` (``result.scaling_summary``) and the chart's Vega-Lite spec (None when
#: computing it failed: the summary then says why, under ``error``).
ScalingView = tuple[dict[str, Any], dict[str, Any] | None]
#: Publish a job's view (under the widget's lock): ``MemSim._show_scaling``.
Publish = Callable[[dict[str, Any], dict[str, Any] | None], None]


def compute_view(est: Estimate, headroom: float, cancelled: Callable[[], bool] | None = None) -> ScalingView:
    """The scaling summary and chart of ``est`` at ``headroom`` (tests put a slowed one in its place).

    ``cancelled``: asked before each stop estimated; ``charts.ScalingCancelled`` is raised when it says so.
    """
    data = charts_mod.scaling_data(est, headroom, cancelled=cancelled)
    return scaling_summary(data), charts_mod.scaling_spec(data, headroom, est.gpu.name)


class ScalingController:
    """The widget's (its ``WidgetHost``'s) scaling view: built in place when memoised, else by one background job
    at a time, the newest estimate's."""

    def __init__(self, host: WidgetHost, publish: Publish) -> None:
        """The scaling slot of a new widget (no job); ``publish`` shows a finished job's view."""
        self.host = host
        self._publish = publish
        self._slot: JobSlot[ScalingView] = JobSlot(host._lock, "memsim-scaling")

    @property
    def job(self) -> BackgroundJob[ScalingView] | None:
        """The current job (finished or not), None when the view shown was built in place."""
        return self._slot.job

    @property
    def pending(self) -> bool:
        """Whether a job computes the view of the scenario shown."""
        return self._slot.running

    def view(self, est: Estimate, headroom: float, defer: bool) -> ScalingView | None:
        """The view of ``est`` at ``headroom`` (under the lock): built here unless ``defer`` and a curve it needs
        is not memoised; then None, and a job (started here) publishes it when done. A pending job is
        superseded either way."""
        self.supersede()
        if not defer or charts_mod.scaling_cached(est):
            return compute_view(est, headroom)

        def work(job: BackgroundJob[ScalingView]) -> ScalingView:
            return compute_view(est, headroom, job.cancel_event.is_set)

        self._slot.start(work, self._finish, subject=(est, headroom))
        return None

    def pause(self) -> None:
        """A new estimate is computed in the kernel's thread (under the lock): a pending job stops at its next
        stop rather than compete with it for the interpreter; ``resume`` restarts it if that edit is rejected."""
        job = self._slot.job
        if job is not None and job.running():
            job.cancel()

    def resume(self, est: Estimate, headroom: float) -> ScalingView | None:
        """The edit that paused the pending job was rejected (under the lock): the view of ``est``, still shown,
        is wanted again: built here when memoised by now, else by a new job (None, as ``view``)."""
        job = self._slot.job
        if job is None or not job.cancelled:
            return None
        return self.view(est, headroom, defer=True)

    def supersede(self) -> None:
        """A newer estimate or headroom is shown (under the lock): a pending job stops and publishes nothing."""
        self.pause()
        self._slot.job = None

    def _finish(
        self, job: BackgroundJob[ScalingView], view: ScalingView | None, error: BaseException | None
    ) -> None:
        """Under the lock, for the current job: publish its view while its estimate and headroom are shown."""
        host = self.host
        est, headroom = job.subject
        if host._closed or job.cancelled or est is not host.estimate or headroom != host.headroom:
            return
        if view is None:
            view = {"error": error_text(error)}, None
        self._publish(*view)
