"""Running a trace for "Verify with trace": whether it can run here, its probe (progress and cancel) and the
runner (``trace_panel`` runs it as a ``background.BackgroundJob``)."""

from __future__ import annotations

import functools
import importlib.util
import threading
import time
from collections.abc import Callable
from typing import Any

from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.trace.traceable import check_traceable

#: What to install for "Verify with trace".
TRACE_EXTRA = "pip install 'memsim-widget[trace]'"
#: Training steps a trace runs (the peak is step 2's, the steady state).
TRACE_STEPS = 2


class TraceCancelled(Exception):
    """A trace stopped because it was cancelled (raised in the trace's thread, or by ``verify``)."""


@functools.cache
def _missing_trace_modules() -> tuple[str, ...]:
    """Modules of the trace extra that are not installed (looked up once, without importing them)."""
    return tuple(name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name) is None)


def trace_check(sc: Scenario) -> ScenarioError | None:
    """Why ``sc`` cannot be traced here (a missing extra, or ``check_traceable``'s error); None when it can."""
    missing = [m for m in _missing_trace_modules() if m != "peft" or sc.method != "full"]
    if missing:
        return ScenarioError("trace", f"needs {' and '.join(missing)}: {TRACE_EXTRA}")
    try:
        check_traceable(sc)
    except ScenarioError as exc:
        return exc
    return None


class TraceProbe:
    """A running trace seen from outside: its stage, the tracker's counters, and a cancel flag.

    ``hook`` is installed as a global module forward pre-hook while the trace runs: in the trace's thread it
    finds the ``MemoryTracker`` on the dispatch-mode stack (so ``snapshot`` can read ops, step, phase and
    bytes from another thread) and raises ``TraceCancelled`` once ``cancel`` is set.
    """

    def __init__(self) -> None:
        """A probe for a trace that has not started yet."""
        self.cancel = threading.Event()
        self.thread_id: int | None = None
        self.stage = "starting"
        self.tracker: Any = None
        self.ops: int | None = None
        self.on_found: Callable[[], None] | None = None
        self.started = time.monotonic()
        self.ended: float | None = None

    def hook(self, module: Any, args: Any) -> None:
        """Forward pre-hook: in the trace's thread, stop if cancelled and find the tracker once."""
        if threading.get_ident() != self.thread_id:
            return
        if self.cancel.is_set():
            raise TraceCancelled("trace cancelled")
        if self.tracker is None:
            from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

            for mode in reversed(_get_current_dispatch_mode_stack()):
                if hasattr(mode, "op_count") and hasattr(mode, "marks") and hasattr(mode, "live_bytes"):
                    self.tracker = mode
                    self.stage = "tracing"
                    if self.on_found is not None:
                        self.on_found()
                    break

    def check(self) -> None:
        """Raise ``TraceCancelled`` if the trace was cancelled."""
        if self.cancel.is_set():
            raise TraceCancelled("trace cancelled")

    def snapshot(self) -> dict[str, Any]:
        """Progress as plain data: stage, elapsed seconds and, once tracing, step, phase, ops, bytes, fraction."""
        end = self.ended if self.ended is not None else time.monotonic()
        out: dict[str, Any] = {
            "stage": self.stage,
            "elapsed_s": round(end - self.started, 1),
            "steps": TRACE_STEPS,
        }
        t = self.tracker
        if t is None:
            if self.ops is not None:
                out["ops"] = self.ops
            return out
        ops = int(t.op_count) if self.ops is None else self.ops
        step = int(t.step)
        out.update(
            ops=ops,
            step=step,
            phase=str(t.phase),
            live_bytes=int(t.live_bytes),
            peak_bytes=int(t.peak_bytes),
        )
        # Step 2 runs the ops of step 1 again: its share of them is the progress of the second half.
        starts = {m["step"]: m["op_index"] for m in list(t.marks) if m["phase"] == "forward"}
        if step >= 2 and 1 in starts and 2 in starts and starts[2] > starts[1]:
            out["fraction"] = round(min(0.99, 0.5 + 0.5 * (ops - starts[2]) / (starts[2] - starts[1])), 3)
        return out


def run_trace(scenario: Scenario, probe: TraceProbe) -> dict[str, Any]:
    """Trace ``scenario`` (two training steps on fake tensors) and return its ``trace_report``.

    Runs in the widget's trace thread; ``probe`` follows it and can cancel it. Tests replace it in
    ``trace_panel``, where the widget looks it up.
    """
    probe.stage = "importing torch"
    import torch

    from memsim_widget.trace.api import trace_report, trace_scenario

    probe.check()
    probe.stage = "building the model"
    handle = torch.nn.modules.module.register_module_forward_pre_hook(probe.hook)
    try:
        result = trace_scenario(scenario, progress=False)
    finally:
        handle.remove()
    probe.check()
    probe.ops = int(result.ops)
    probe.stage = "comparing with the simulation"
    report = trace_report(scenario, result)
    del result
    return report
