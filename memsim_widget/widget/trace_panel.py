"""The "Verify with trace" panel: the view of a finished trace and the controller that runs and shows one.

``MemSim.verify`` or the button (a ``{"type": "verify"}`` message) traces the current scenario in a background
thread (``trace_runner``: two training steps on fake tensors), publishes its progress in the ``trace`` trait,
then shows traced against simulated bytes and the timeline (``trace_view``). A later scenario change marks
that result stale; it never runs on an ordinary update.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memsim_widget import charts as charts_mod
from memsim_widget.charts import trace as trace_charts
from memsim_widget.engine.items import CATEGORIES
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.trace.replay import on_card_text
from memsim_widget.units import fmt_bytes
from memsim_widget.widget.background import BackgroundJob, JobSlot, error_text
from memsim_widget.widget.scenario_edits import changed_keys
from memsim_widget.widget.trace_runner import TraceCancelled, TraceProbe, run_trace, trace_check

if TYPE_CHECKING:
    from memsim_widget.widget.host import WidgetHost

#: Seconds between two progress updates of a running trace.
TRACE_POLL_S = 0.25


def _pct(value: int, reference: int) -> float | None:
    """``value`` relative to ``reference`` in percent (None when the reference is 0)."""
    return round((value - reference) / reference * 100, 2) + 0.0 if reference else None  # + 0.0: no -0.0


def build_trace_view(report: Mapping[str, Any], seconds: float | None = None) -> dict[str, Any]:
    """The ``trace_view`` trait of a trace report: traced vs simulated peak and per category, and chart specs.

    The error is the simulation's, relative to the trace: ``(simulated - traced) / traced`` in percent.
    """
    traced = int(report["peak_tensor_bytes"])
    sim = report.get("simulated") or {}
    simulated = int(sim.get("peak_tensor_bytes", 0))
    comps, sim_comps = report.get("components") or {}, sim.get("components") or {}
    names = [c for c in CATEGORIES if c in comps or c in sim_comps]
    names += sorted((set(comps) | set(sim_comps)) - set(names))
    categories = []
    for name in names:
        t, s = int(comps.get(name, 0)), int(sim_comps.get(name, 0))
        if t or s:
            categories.append(
                {
                    "category": name,
                    "traced": t,
                    "simulated": s,
                    "traced_size": fmt_bytes(t),
                    "simulated_size": fmt_bytes(s),
                    "error_pct": _pct(s, t),
                }
            )
    scenario = report.get("scenario") or {}
    summary = {
        "model": charts_mod.model_label(scenario.get("model")),
        "scenario": scenario,
        "traced": {
            "bytes": traced,
            "size": fmt_bytes(traced),
            "phase": report.get("peak_phase", ""),
            "op": report.get("peak_op", ""),
            "step": report.get("peak_step"),
        },
        "simulated": {"bytes": simulated, "size": fmt_bytes(simulated), "phase": sim.get("peak_phase", "")},
        "error_pct": _pct(simulated, traced),
        "step1_bytes": report.get("step1_peak_tensor_bytes"),
        "parameters": (report.get("model") or {}).get("parameters"),
        "categories": categories,
        "notes": list(report.get("notes") or []),
        "seconds": seconds,
        "counter": report.get("counter", ""),
        "rank": _rank_summary(report),
        "counters": _counter_rows(report),
        "on_card": on_card_text((report.get("counters") or {}).get("on_card")),
    }
    return {"summary": summary, "charts": trace_charts.verify_specs(dict(report), schema=charts_mod.SCHEMA)}


#: The GPU counters Verify holds side by side: the traced run's by replay of its allocations through the caching
#: allocator (``trace/replay.py``), the simulation's from the engine.
COUNTER_LABELS = (
    ("peak_allocated_bytes", "allocated"),
    ("peak_reserved_bytes", "reserved"),
    ("device_total_bytes", "nvidia-smi"),
)


def _counter_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Traced (replayed) against simulated bytes for allocated, reserved and nvidia-smi (none without a replay)."""
    traced, sim = report.get("counters") or {}, report.get("simulated") or {}
    rows = []
    for key, label in COUNTER_LABELS:
        if key in traced and key in sim:
            t, s = int(traced[key]), int(sim[key])
            rows.append({"counter": label, "traced": t, "simulated": s, "error_pct": _pct(s, t)})
    return rows


def _rank_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """Which rank the trace ran, in words, and the engine's stage it is compared with."""
    sim = report.get("simulated") or {}
    return {
        "index": int(report.get("rank", 0) or 0),
        "world_size": int(report.get("world_size", 1) or 1),
        "role": report.get("rank_role", "") or "",
        "simulated_stage": sim.get("stage"),
        "simulated_role": sim.get("role", ""),
    }


class TraceController:
    """The "Verify with trace" panel of a widget (its ``WidgetHost``): the running job, the last report.

    ``MemSim.verify``, ``cancel_verify`` and ``trace_report`` delegate here. Tests replace ``run_trace`` and
    ``TRACE_POLL_S`` in this module, where the controller looks them up.
    """

    def __init__(self, host: WidgetHost) -> None:
        """The trace state of a new widget: no job, no report."""
        self.host = host
        self.jobs: JobSlot[dict[str, Any]] = JobSlot(host._lock, "memsim-trace")
        self.report: dict[str, Any] | None = None
        self.probe: TraceProbe | None = None  # the current job's

    @property
    def job(self) -> BackgroundJob[dict[str, Any]] | None:
        """The last trace started (running or not); None before the first."""
        return self.jobs.job

    def initial(self) -> dict[str, Any]:
        """The ``trace`` trait of a new widget."""
        return {"state": "idle", "progress": {}, "error": "", **self.flags()}

    def flags(self, state: str = "idle") -> dict[str, Any]:
        """The parts of ``trace`` that follow the scenario: available/reason, stale/stale_keys, running_stale."""
        host = self.host
        if host._last_exc is not None:
            reason = "fix the rejected input first (a trace runs the scenario shown)"
        else:
            exc = trace_check(host.scenario)
            reason = "" if exc is None else str(exc)
        shown = (self.report or {}).get("scenario")
        valid = host._valid
        stale_keys = sorted(changed_keys(shown, valid) | changed_keys(valid, shown)) if shown else []
        job = self.job
        return {
            "available": not reason,
            "reason": reason,
            "stale": bool(stale_keys),
            "stale_keys": stale_keys,
            "running_stale": state in ("running", "cancelling") and job is not None and job.subject != valid,
        }

    def update(self, **changes: Any) -> None:
        """Update the ``trace`` trait (call under the lock); sends nothing when nothing changed."""
        new = {**self.host._trait("trace"), **changes}
        new.update(self.flags(new.get("state", "idle")))
        self.host._publish("trace", new)

    def start(self, strict: bool) -> BackgroundJob[dict[str, Any]] | None:
        """Start tracing the current scenario in a thread; the running job if it already traces it.

        ``strict`` (the Python API): raise when the scenario cannot be traced, and cancel a running trace of
        another scenario first. Otherwise (a click) such requests are ignored and return None.
        """
        host = self.host
        with host._lock:
            flags = self.flags()
            if not flags["available"]:
                if strict:
                    raise trace_check(host.scenario) or ScenarioError("trace", flags["reason"])
                return None
            previous = self.job
            if previous is not None and previous.running():
                if previous.subject == host._valid and not previous.cancelled:
                    return previous
                if not strict:
                    return None
                previous.cancel()
            else:
                previous = None
            sc, probe = host.scenario, TraceProbe()
            self.probe = probe
            job = self.jobs.start(
                lambda job: self._work(job, sc, probe, previous),
                self._finish,
                subject=host._valid,
                cancel=probe.cancel,
                tick=(TRACE_POLL_S, self._publish_progress),
            )
            self.update(state="running", progress=probe.snapshot(), error="")
            return job

    def _work(
        self,
        job: BackgroundJob[dict[str, Any]],
        sc: Scenario,
        probe: TraceProbe,
        previous: BackgroundJob[Any] | None,
    ) -> dict[str, Any]:
        """The trace thread's work: wait for a cancelled predecessor, then trace."""
        probe.thread_id = threading.get_ident()
        probe.on_found = lambda: self._publish_progress(job)
        try:
            if previous is not None:
                probe.stage = "stopping the previous trace"
                previous.done.wait()
            probe.check()
            report = run_trace(sc, probe)
            probe.check()
            return report
        finally:
            probe.ended = time.monotonic()

    def _snapshot(self) -> dict[str, Any]:
        """The current job's progress."""
        assert self.probe is not None
        return self.probe.snapshot()

    def _publish_progress(self, job: BackgroundJob[Any]) -> None:
        """Copy the job's progress into ``trace`` while it is the running one."""
        with self.host._lock:
            if self.job is job and self.host._trait("trace").get("state") in ("running", "cancelling"):
                self.update(progress=self._snapshot())

    def _finish(
        self, job: BackgroundJob[dict[str, Any]], report: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        """Show a finished job's report, or why it stopped (under the lock; current jobs only)."""
        progress = {**self._snapshot(), "stage": "finished"}
        if isinstance(error, TraceCancelled) or (error is None and job.cancelled):
            self.update(state="cancelled", progress=progress, error="")
        elif error is not None:
            self.update(state="error", progress=progress, error=error_text(error))
        else:
            assert report is not None
            with self.host.hold_sync():
                self.report = report
                self.host._publish("trace_view", build_trace_view(report, seconds=progress["elapsed_s"]))
                self.update(state="done", progress={**progress, "fraction": 1.0}, error="")

    def verify_msg(self, content: Mapping[str, Any]) -> None:
        """The "Verify with trace" button: trace the current scenario unless it cannot be or already is."""
        self.start(strict=False)

    def cancel_msg(self, content: Mapping[str, Any]) -> None:
        """The button while a trace runs: cancel it."""
        self.cancel()

    def verify(self, wait: bool = True, timeout: float | None = None) -> Any:
        """``MemSim.verify``: trace now; the report (``wait``) or its future."""
        job = self.start(strict=True)
        assert job is not None
        if not wait:
            return job.future
        try:
            return job.future.result(timeout)
        except KeyboardInterrupt:
            self.cancel()
            raise

    def cancel(self) -> bool:
        """``MemSim.cancel_verify``: cancel the running trace; False when none is running."""
        with self.host._lock:
            job = self.job
            if job is None or not job.running() or job.cancelled:
                return False
            job.cancel()
            self.update(state="cancelling", progress=self._snapshot())
            return True
