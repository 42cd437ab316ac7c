"""The "Verify with trace" panel: the view of a finished trace and the ``MemSim`` methods that run and show one.

``MemSim.verify`` or the button (a ``{"type": "verify"}`` message) traces the current scenario in a background
thread (``trace_runner``: two training steps on fake tensors), publishes its progress in the ``trace`` trait,
then shows traced against simulated bytes and the timeline (``trace_view``). A later scenario change marks
that result stale; it never runs on an ordinary update.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from memsim_widget import charts as charts_mod
from memsim_widget.engine.items import CATEGORIES, fmt_bytes
from memsim_widget.errors import ScenarioError
from memsim_widget.trace import charts as trace_charts
from memsim_widget.widget.scenario_edits import changed_keys
from memsim_widget.widget.trace_runner import TraceCancelled, _TraceJob, run_trace, trace_check

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
    }
    return {"summary": summary, "charts": trace_charts.verify_specs(dict(report), schema=charts_mod.SCHEMA)}


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


class TracePanel:
    """``MemSim``'s "Verify with trace" methods (a mixin: the traits, ``_lock`` and the scenario are MemSim's).

    Tests replace ``run_trace`` and ``TRACE_POLL_S`` in this module, where the methods look them up.
    """

    def _init_trace(self) -> None:
        """The trace state of a new widget: no job, no report."""
        self._trace_job: _TraceJob | None = None
        self._trace_report: dict[str, Any] | None = None

    def _trace_flags(self, state: str = "idle") -> dict[str, Any]:
        """The parts of ``trace`` that follow the scenario: available/reason, stale/stale_keys, running_stale."""
        if self._last_exc is not None:
            reason = "fix the rejected input first (a trace runs the scenario shown)"
        else:
            exc = trace_check(self._scenario)
            reason = "" if exc is None else str(exc)
        shown = (self._trace_report or {}).get("scenario")
        stale_keys = (
            sorted(changed_keys(shown, self._valid) | changed_keys(self._valid, shown)) if shown else []
        )
        job = self._trace_job
        return {
            "available": not reason,
            "reason": reason,
            "stale": bool(stale_keys),
            "stale_keys": stale_keys,
            "running_stale": state in ("running", "cancelling")
            and job is not None
            and job.data != self._valid,
        }

    def _set_trace(self, **changes: Any) -> None:
        """Update the ``trace`` trait (call under the lock); sends nothing when nothing changed."""
        new = {**self.trace, **changes}
        new.update(self._trace_flags(new.get("state", "idle")))
        if new != self.trace:
            self.trace = new

    def _start_trace(self, strict: bool) -> _TraceJob | None:
        """Start tracing the current scenario in a thread; the running job if it already traces it.

        ``strict`` (the Python API): raise when the scenario cannot be traced, and cancel a running trace of
        another scenario first. Otherwise (a click) such requests are ignored and return None.
        """
        with self._lock:
            flags = self._trace_flags()
            if not flags["available"]:
                if strict:
                    raise trace_check(self._scenario) or ScenarioError("trace", flags["reason"])
                return None
            previous = self._trace_job
            if previous is not None and previous.running():
                if previous.data == self._valid and not previous.probe.cancel.is_set():
                    return previous
                if not strict:
                    return None
                previous.probe.cancel.set()
            else:
                previous = None
            job = _TraceJob(self._scenario, previous)
            self._trace_job = job
            job.thread = threading.Thread(
                target=self._trace_worker, args=(job,), name="memsim-trace", daemon=True
            )
            self._set_trace(state="running", progress=job.probe.snapshot(), error="")
            job.thread.start()
            return job

    def _publish_progress(self, job: _TraceJob) -> None:
        """Copy the job's progress into ``trace`` while it is the running one."""
        with self._lock:
            if self._trace_job is job and self.trace.get("state") in ("running", "cancelling"):
                self._set_trace(progress=job.probe.snapshot())

    def _trace_worker(self, job: _TraceJob) -> None:
        """The trace thread: wait for a cancelled predecessor, trace, publish the outcome, resolve the future."""
        probe = job.probe
        probe.thread_id = threading.get_ident()
        probe.on_found = lambda: self._publish_progress(job)
        poller = threading.Thread(
            target=self._poll_progress, args=(job,), name="memsim-trace-progress", daemon=True
        )
        poller.start()
        report: dict[str, Any] | None = None
        error: BaseException | None = None
        try:
            if job.previous is not None:
                probe.stage = "stopping the previous trace"
                job.previous.done.wait()
                job.previous = None
            probe.check()
            report = run_trace(job.scenario, probe)
            probe.check()
        except (
            BaseException
        ) as exc:  # anything the trace raises is shown in the widget and kept in the future
            error, report = exc, None
        finally:
            probe.ended = time.monotonic()
        try:
            self._finish_trace(job, report, error)
        finally:
            job.done.set()
            if error is None:
                job.future.set_result(report)  # type: ignore[arg-type]
            else:
                job.future.set_exception(error)
            poller.join()

    def _poll_progress(self, job: _TraceJob) -> None:
        """Publish the job's progress every ``TRACE_POLL_S`` seconds until it is done."""
        while not job.done.wait(TRACE_POLL_S):
            self._publish_progress(job)

    def _finish_trace(
        self, job: _TraceJob, report: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        """Show a finished job's report (or why it stopped) unless a newer job replaced it."""
        with self._lock:
            if self._trace_job is not job:
                return
            progress = {**job.probe.snapshot(), "stage": "finished"}
            if isinstance(error, TraceCancelled) or (error is None and job.probe.cancel.is_set()):
                self._set_trace(state="cancelled", progress=progress, error="")
            elif error is not None:
                text = str(error) if isinstance(error, ScenarioError) else f"{type(error).__name__}: {error}"
                self._set_trace(state="error", progress=progress, error=text)
            else:
                assert report is not None
                with self.hold_sync():
                    self._trace_report = report
                    self.trace_view = build_trace_view(report, seconds=progress["elapsed_s"])
                    self._set_trace(state="done", progress={**progress, "fraction": 1.0}, error="")

    def verify(self, wait: bool = True, timeout: float | None = None) -> Any:
        """Trace the current scenario in the background and show traced vs simulated bytes in the widget.

        ``wait=True`` blocks until the trace is done and returns its report (``memsim_widget.trace.api.
        trace_report``: ``peak_tensor_bytes``, ``components``, ``timeline``, ``top``, ``simulated``, ...), also
        kept as ``trace_report``; ``wait=False`` returns a ``concurrent.futures.Future`` of it. Raises
        ``ScenarioError`` when the scenario cannot be traced here (the reason the button shows), the trace's
        own error if it fails, and ``TraceCancelled`` if it was cancelled. Interrupting the wait cancels it.
        A trace of the same scenario already running is reused; one of another scenario is cancelled first.
        """
        job = self._start_trace(strict=True)
        assert job is not None
        if not wait:
            return job.future
        try:
            return job.future.result(timeout)
        except KeyboardInterrupt:
            self.cancel_verify()
            raise

    def cancel_verify(self) -> bool:
        """Cancel the running trace (it stops at its next module call); False when none is running."""
        with self._lock:
            job = self._trace_job
            if job is None or not job.running() or job.probe.cancel.is_set():
                return False
            job.probe.cancel.set()
            self._set_trace(state="cancelling", progress=job.probe.snapshot())
            return True

    @property
    def trace_report(self) -> dict[str, Any] | None:
        """The report of the last finished trace (None before the first); ``trace["stale"]`` says if it is
        of another scenario than the current one."""
        return self._trace_report
