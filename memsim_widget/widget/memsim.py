"""The ``MemSim`` widget: its traits, the update that recomputes them from the scenario, and the Python API.

Python is the single source of truth: the front end only writes ``scenario_data`` (and ``headroom``,
``fit_open``) and sends messages; every derived trait is recomputed here. The panels are controller objects the
widget owns (``trace_panel``, ``fit_panel``, ``layouts_panel``, ``compare_panel``, ``export_panel``): they see it
through the ``host.WidgetHost`` protocol, and its public methods delegate to them. Front-end messages go through
one dispatch table of the panels' handlers (``_handlers``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anywidget
import traitlets

from memsim_widget import charts as charts_mod
from memsim_widget.charts.phases import phase_spec
from memsim_widget.charts.times import time_spec
from memsim_widget.engine.core import estimate as run_estimate
from memsim_widget.engine.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.errors import ScenarioError, one_line, short_repr
from memsim_widget.scenario import Scenario
from memsim_widget.units import GiB
from memsim_widget.widget.assets import asset, vega_bundle
from memsim_widget.widget.calibration_panel import CalibrationController
from memsim_widget.widget.compare_panel import CompareController
from memsim_widget.widget.controls import build_options, normalize
from memsim_widget.widget.export_panel import ExportController
from memsim_widget.widget.fit_panel import FitController, fit_target
from memsim_widget.widget.host import PanelTrait, WidgetHost
from memsim_widget.widget.import_panel import ImportController, MeasureController
from memsim_widget.widget.layouts_panel import LayoutsController
from memsim_widget.widget.result import SCALING_PENDING, build_result
from memsim_widget.widget.scaling_panel import ScalingController
from memsim_widget.widget.scenario_edits import (
    as_typed,
    changed_keys,
    check_edit,
    defaults,
    drop_carried_unknown,
    flatten,
    keep_known,
    merge,
    with_frozen_model,
)
from memsim_widget.widget.trace_panel import TraceController

if TYPE_CHECKING:
    from memsim_widget.comparison import Comparison
    from memsim_widget.plan import Plan, Recommendation

#: A front-end message's handler: it gets the message's content.
Handler = Callable[[Mapping[str, Any]], None]


def _json_text(value: Any, widget: Any) -> str:
    """Send a large derived trait as JSON text: ipywidgets then skips walking it for binary buffers (~4 ms)."""
    return json.dumps(value, separators=(",", ":"))


class MemSim(anywidget.AnyWidget):
    """GPU-memory simulator widget: controls for a ``Scenario``, the verdict, breakdown, scaling and table.

    The "Verify with trace", "Make it fit", compare and launch-config panels are the controllers ``_trace``,
    ``_fit``, ``_layouts``, ``_compare_panel`` and ``_export``; the methods below delegate to them. ``MemSim`` is
    their ``WidgetHost``.
    """

    _esm = asset("widget.js")
    _css = asset("widget.css")

    #: The scenario as JSON (every key resolved when valid): the single source of truth for the controls.
    scenario_data = traitlets.Dict().tag(sync=True)
    #: The controls to draw (``controls``: key, label, kind, group; ``controls.CONTROLS``), allowed values per
    #: control, presets, GPUs, slider stops, and which controls/values are disabled.
    #: (``options``, ``result`` and ``charts`` are dicts in Python and reach the browser as JSON text.)
    options = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: The last valid result: verdict, peaks with counters, bottleneck, per-rank bytes, breakdown rows, and the
    #: scaling summary (``scaling``: largest micro-batch / sequence that fit; ``{"pending": True}`` while a
    #: front-end edit's scaling view is computed in the background, ``scaling_panel``).
    result = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Vega-Lite specs: ``breakdown``, ``scaling`` and ``time`` (where a step's modelled time goes). While
    #: ``result["scaling"]`` is pending, ``scaling`` is still the previous scenario's chart (shown as updating).
    charts = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: ``"<field>: <message>"`` of the last rejected scenario, '' when the scenario is valid.
    error = traitlets.Unicode("").tag(sync=True)
    #: The dotted field the error names (e.g. ``parallel.tp``).
    error_field = traitlets.Unicode("").tag(sync=True)
    #: Share of GPU memory kept free for the verdict (0.10 = 10 %).
    headroom = traitlets.Float(DEFAULT_HEADROOM).tag(sync=True)
    #: vega-embed as an ES-module string ('' if vl-convert is missing: the charts then don't draw).
    _vega_js = traitlets.Unicode("").tag(sync=True)
    #: "Verify with trace": ``state`` (idle, running, cancelling, done, error, cancelled), ``available`` and
    #: ``reason`` (why the button is disabled), ``progress`` (stage, elapsed_s, step, phase, ops, live/peak
    #: bytes, fraction), ``error``, ``stale`` with ``stale_keys`` (the shown trace is of another scenario)
    #: and ``running_stale`` (the running trace is of another scenario).
    trace = traitlets.Dict().tag(sync=True)
    #: The last finished trace: ``summary`` (traced vs simulated peak and per category, error in percent)
    #: and ``charts`` (``comparison`` and ``timeline`` Vega-Lite specs); {} before the first trace.
    trace_view = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Whether the "Make it fit" panel is open (the front end writes it): only then do recommendations follow
    #: every scenario change.
    fit_open = traitlets.Bool(False).tag(sync=True)
    #: "Make it fit": ``state`` (idle, running, done, error), ``error``, ``id`` (of the shown ``view``; "Apply"
    #: names it), ``ms`` (time to compute), ``stale`` (the view is of another scenario or headroom),
    #: ``rejected`` (the input shown is rejected: the view is of the last valid scenario) and ``view``
    #: (``build_fit_view``: changes that fit, single levers, max micro-batch/sequence, min GPUs; None before).
    fit = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Candidate layouts (``plan``, on request): ``state`` (idle, running, done, error), ``error``, ``id``, ``ms``,
    #: ``gpus`` (the GPU count searched), ``stale`` with ``stale_keys`` (non-searched keys changed since), and
    #: ``view`` (``build_layouts_view``: counts, summary, the top candidates, the chart's Vega-Lite spec; each
    #: top row's ``current`` says whether the scenario shown uses it).
    layouts = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Pinned scenarios, at most ``MAX_PINS``: ``[{"name", "scenario"}]``. The front end appends the current
    #: ``scenario_data`` ("Pin") or drops an entry; Python checks, names (``pin N``) and estimates each pin once.
    pins = traitlets.List().tag(sync=True)
    #: The pins beside the current scenario: ``error`` (why the last pin was refused), ``max_pins``, ``pins``
    #: (name and one-line summary each) and ``view`` (``build_compare_view``: headline rows, the fields that
    #: differ, the chart's Vega-Lite spec; None without pins).
    comparison = traitlets.Dict(CompareController.initial()).tag(sync=True, to_json=_json_text)
    #: The launch-config export: ``formats`` (the dropdown), ``id`` (one more per request answered), ``format``,
    #: ``files`` (file name -> text of the last export), ``error`` (the refusal naming the field, '' when the files
    #: were written).
    export = traitlets.Dict().tag(sync=True)
    #: A calibrated model's first estimate of a recipe, run in the background (``calibration_panel``): ``state``
    #: (idle, running, done, error), ``model``, ``error``, ``seconds``. While running, the front end shows
    #: "calibrating..." over the last result; the estimate replaces it when done.
    calibration = traitlets.Dict(CalibrationController.initial()).tag(sync=True)
    #: "Open a config" (``import_panel``): ``id`` (one more per answer), ``files``, ``unread`` (the memory settings
    #: the files did not give, one line each) and ``error`` (the file and key that is wrong).
    config_import = traitlets.Dict(ImportController.initial()).tag(sync=True)
    #: "Measure on this GPU" (``import_panel``): ``available`` (a CUDA GPU is likely: the button shows),
    #: ``state`` (idle, running, done, error), ``text`` (measured next to predicted) and ``error``.
    measure = traitlets.Dict().tag(sync=True)

    def __init__(
        self,
        scenario: Scenario | Mapping[str, Any] | None = None,
        *,
        headroom: float = DEFAULT_HEADROOM,
        charts_js: bool = True,
        **changes: Any,
    ) -> None:
        """Start from a ``Scenario`` or dict (default scenario if None), with keyword changes on top.

        ``charts_js=False`` leaves out the vega-embed bundle (0.9 MB): the browser then draws no charts
        (headless use, tests). An invalid starting scenario raises ``ScenarioError``.
        """
        base = scenario if isinstance(scenario, Scenario) else Scenario.from_dict(scenario or {})
        if changes:
            data = merge(base.to_dict(), changes)
            if "num_gpus" not in changes:
                data.pop("num_gpus")
            base = Scenario.from_dict(data)
        est = run_estimate(base)  # raises ScenarioError: there is no previous result to fall back on
        self._scenario: Scenario = base
        self._estimate: Estimate = est
        self._valid: dict[str, Any] = base.to_dict()
        self._busy = True  # no observer runs while the traits get their first values
        self._last_exc: ScenarioError | None = None
        # The trace thread writes traits too: every trait write of the widget happens under this lock.
        self._lock = threading.RLock()
        self._closed = False
        # MemSim is the panels' WidgetHost; pyright types a traitlets trait (headroom, scenario_data) as the trait
        # object on class access, so it cannot match them to the protocol's properties: the cast says it.
        host = cast("WidgetHost", self)
        self._trace = TraceController(host)
        self._fit = FitController(host)
        self._layouts = LayoutsController(host)
        self._compare_panel = CompareController(host)
        self._export = ExportController(host)
        self._calibration = CalibrationController(host)
        self._import = ImportController(host)
        self._measure = MeasureController(host)
        self._scaling = ScalingController(host, self._show_scaling)
        #: Front-end message type -> its handler (``_on_front_msg``).
        self._handlers: dict[str, Handler] = {
            "verify": self._trace.verify_msg,
            "cancel": self._trace.cancel_msg,
            "fit_apply": self._fit.apply_msg,
            "layouts": self._layouts.search_msg,
            "layout_apply": self._layouts.apply_msg,
            "export": self._export.export_msg,
            "import_config": self._import.import_msg,
            "measure": self._measure.measure_msg,
        }
        self.last_update_ms = 0.0
        headroom = self._check_headroom({"value": headroom})
        super().__init__(
            scenario_data=self._valid,
            options=build_options(self._valid),
            headroom=headroom,
            _vega_js=vega_bundle() if charts_js else "",
            trace=self._trace.initial(),
            fit=self._fit.initial(),
            layouts=self._layouts.initial(),
            export=self._export.initial(),
            measure=self._measure.initial(),
            **self._derived(est, headroom),
        )
        self.on_msg(self._on_front_msg)
        self._busy = False

    # ----- trait observers ------------------------------------------------------------------------------
    @traitlets.validate("headroom")
    def _check_headroom(self, proposal: Mapping[str, Any]) -> float:
        """Headroom is a share in [0, 0.9]."""
        value = proposal["value"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 0.9:
            raise traitlets.TraitError(f"headroom must be a number from 0 to 0.9, got {short_repr(value)}")
        return float(value)

    @traitlets.observe("headroom")
    def _on_headroom(self, change: Any) -> None:
        """A new headroom changes the verdict and the charts' band."""
        if not self._busy and hasattr(self, "_estimate"):
            with self._lock, self.hold_sync():
                self._refresh(defer=True)
                self._follow_plan()

    @traitlets.observe("fit_open")
    def _on_fit_open(self, change: Any) -> None:
        """Opening the panel computes the recommendations of the current scenario unless they are shown."""
        if not self._busy and hasattr(self, "_estimate"):
            with self._lock:
                self._follow_plan()

    @traitlets.observe("scenario_data")
    def _on_scenario_data(self, change: Any) -> None:
        """The front end (or Python) wrote a scenario: validate, recompute, or show the error."""
        if self._busy:
            return
        new, old = change["new"], change["old"]
        if isinstance(new, Mapping) and isinstance(old, Mapping):
            new = drop_carried_unknown(new, old, frozenset())
        self._submit(new, background=True)

    @traitlets.observe("pins")
    def _on_pins(self, change: Any) -> None:
        """The front end (or Python) wrote the pins: the compare panel checks, names and estimates them."""
        if "_compare_panel" in self.__dict__:
            self._compare_panel.written(change["new"])

    def set_state(self, sync_data: dict[str, Any]) -> None:
        """Front-end writes apply under the widget's lock (the trace thread writes traits too), one trait at a
        time: a value a trait refuses (``headroom`` "x" or 5, ``fit_open`` 3, ``scenario_data`` a list) becomes
        the widget's error naming the trait, in place, and the front end gets the trait's current value back;
        it never raises out of the comm handler."""
        with self._lock:
            for name, value in sync_data.items():
                try:
                    super().set_state({name: value})
                except traitlets.TraitError as exc:
                    self._refuse_state(name, exc)

    def _refuse_state(self, name: str, exc: traitlets.TraitError) -> None:
        """Show a refused front-end write as the error of its trait and re-send the trait's value."""
        message = str(exc).replace(f"The '{name}' trait of a MemSim instance ", "")
        self.error = one_line(f"{name}: {message}")[:300]
        self.error_field = name
        if name in self.keys:
            self.send_state(name)

    # ----- core update ----------------------------------------------------------------------------------
    def _submit(
        self,
        data: Mapping[str, Any],
        relative: bool = True,
        explicit: frozenset[str] = frozenset(),
        background: bool = False,
        ready: Estimate | None = None,
        defer_scaling: bool | None = None,
    ) -> ScenarioError | None:
        """Apply a scenario dict; returns the ScenarioError that rejected it (None when it was valid).

        ``relative``: the dict is the previous scenario with some controls moved, so controls the move made
        inapplicable are reset (``normalize``) and an unchanged ``num_gpus`` follows the new layout; ``explicit``
        keys count as changed even when their value stays (``set(parallel={"tp": 1, "sequence_parallel": True})``).
        Omitted keys take their defaults, as in ``Scenario.from_dict``. ``background`` (an edit from the front end):
        a calibrated model's first estimate of a recipe runs as a background job (``calibration_panel``) instead of
        blocking here; None is returned and the estimate is published when it is done. ``ready``: that job's
        estimate, used when it is of the same scenario (not computed again in the kernel's thread).
        ``defer_scaling`` (default: ``background``): the scaling chart and summary not memoised yet are computed
        by a background job (``scaling_panel``), published when done; meanwhile ``result["scaling"]`` is pending.
        """
        with self._lock:
            defer = background if defer_scaling is None else defer_scaling
            return self._apply(data, relative, explicit, background, ready, defer)

    def _apply(
        self,
        data: Mapping[str, Any],
        relative: bool,
        explicit: frozenset[str],
        background: bool = False,
        ready: Estimate | None = None,
        defer_scaling: bool = False,
    ) -> ScenarioError | None:
        """``_submit`` without the lock."""
        t0 = time.perf_counter()
        exc = check_edit(data)  # sizes, depth, int64, finite, UTF-8: before any rule or the scenario sees it
        if exc is not None:
            self._busy = True
            try:  # the out-of-bounds value is not shown back (its key shows empty); the rest as typed
                top = exc.field.split(".")[0].split("[")[0]
                shown = {**data, top: None} if isinstance(data, Mapping) and top in data else {}
                self._reject(shown, exc)
            finally:
                self._busy = False
            return exc
        data = merge(defaults(), data)
        changed = changed_keys(self._valid, data) | explicit if relative else set()
        data = with_frozen_model(data)  # from here one model object: its architecture is resolved once
        if relative:
            if "num_gpus" not in changed:
                data["num_gpus"] = None  # derived from the layout unless set on purpose
            data = normalize(data, changed)
        self._busy = True
        try:
            try:
                sc = Scenario.from_dict(data)
                if background and self._calibration.needed(sc):
                    self._calibration.start(sc, data, explicit)
                    self._show_calibrating(data)
                    return None
                self._calibration.supersede()
                if ready is not None and ready.scenario == sc:
                    est = ready
                else:
                    self._scaling.pause()  # its job would compete with this estimate (resumed if rejected)
                    est = run_estimate(sc)
            except ScenarioError as exc:
                self._reject(data, exc)
                return exc
            except Exception as exc:  # an engine bug must not freeze the widget silently
                self._reject(data, ScenarioError("scenario", f"internal error {type(exc).__name__}: {exc}"))
                return self._last_exc
            self._scenario, self._estimate, self._valid = sc, est, sc.to_dict()
            self._last_exc = None
            with self.hold_sync():
                self.scenario_data = self._valid
                self.error = ""
                self.error_field = ""
                self.options = build_options(self._valid, est.arch)  # resolved for sc already
                self._refresh(defer_scaling)
                self._trace.update()
                self._follow_plan()
            return None
        finally:
            self._busy = False
            self.last_update_ms = (time.perf_counter() - t0) * 1000

    def _completed(self, typed: dict[str, Any]) -> dict[str, Any]:
        """An input the controls show without its estimate, completed from the last valid scenario (its GPU
        count too, where the input leaves it to the layout)."""
        shown = merge(self._valid, typed)
        if shown.get("num_gpus") is None:
            shown["num_gpus"] = self._valid["num_gpus"]
        return shown

    def _reject(self, data: dict[str, Any], exc: ScenarioError) -> None:
        """Keep the previous result; show the input as typed (completed from the last valid one) and the error."""
        self._last_exc = exc
        shown = self._completed(as_typed(data))
        with self.hold_sync():
            self.scenario_data = shown
            self.error = str(exc)
            self.error_field = exc.field
            self.options = build_options(shown)
            self._trace.update()
            self._fit.update()
            self._layouts.update()
            view = self._scaling.resume(self._estimate, self.headroom)  # the last result's, if paused
            if view is not None:
                self._show_scaling(*view)

    def _show_calibrating(self, data: dict[str, Any]) -> None:
        """Show the input being calibrated in the controls, over the last valid result (no error)."""
        self._last_exc = None
        shown = self._completed(keep_known(data))
        with self.hold_sync():
            self.scenario_data = shown
            self.error = ""
            self.error_field = ""
            self.options = build_options(shown)

    def _derived(self, est: Estimate, headroom: float, defer: bool = False) -> dict[str, Any]:
        """``result`` and ``charts`` of an estimate at a headroom. ``defer``: a scaling view not memoised is left
        to a background job (``scaling_panel``): the summary is then pending and the chart the previous one."""
        view = self._scaling.view(est, headroom, defer)
        summary, scaling = view if view is not None else (SCALING_PENDING, self.charts.get("scaling"))
        return {
            "result": {**build_result(est, headroom), "scaling": dict(summary)},
            "charts": {
                "breakdown": charts_mod.breakdown_spec(est, headroom),
                **({"scaling": scaling} if scaling is not None else {}),
                "time": time_spec(est),
                # GRPO/PPO/DPO: the rollout and training phases side by side (none for SFT)
                **({"phases": phase_spec(est, headroom)} if est.scenario.objective_name != "sft" else {}),
            },
        }

    def _refresh(self, defer: bool = False) -> None:
        """Recompute result and charts from the current estimate and headroom (``defer``: see ``_derived``)."""
        for name, value in self._derived(self._estimate, self.headroom, defer).items():
            setattr(self, name, value)
        self._compare_panel.update()

    def _show_scaling(self, summary: dict[str, Any], spec: dict[str, Any] | None) -> None:
        """Publish a background job's scaling view of the current estimate and headroom (under the lock)."""
        charts = dict(self.charts)
        if spec is None:  # computing it failed: the summary says why
            charts.pop("scaling", None)
        else:
            charts["scaling"] = spec
        with self.hold_sync():
            self.charts = charts
            self.result = {**self.result, "scaling": summary}

    # ----- front-end messages, following changes, closing -----------------------------------------------
    def _on_front_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """A message from the front end, ``{"type": ..., ...}``, to its handler in ``_handlers``: ``verify``,
        ``cancel`` (trace); ``fit_apply`` (kind, index, id), ``layouts`` (gpus) and ``layout_apply`` (candidate,
        id) for "Make it fit"; ``export`` (format) for the launch config; ``import_config`` (files, format) for
        "open a config"; ``measure`` for "Measure on this GPU". A message without a ``type`` is not
        the widget's (anywidget's commands); an unknown type shows as the widget's error (a front end of
        another version)."""
        if not isinstance(content, Mapping) or "type" not in content:
            return
        handler = self._handlers.get(content["type"]) if isinstance(content["type"], str) else None
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            with self._lock:
                self.error = (
                    f"message: unknown type {content['type']!r} from the front end (known: {known}); "
                    "is the front end of another memsim-widget version? Reload the page"
                )
                self.error_field = "message"
            return
        handler(content)

    def _follow_plan(self) -> None:
        """After a change (under the lock): refresh both panels' stale flags; recompute recommendations if open."""
        self._fit.update()
        self._layouts.update()
        if self.fit_open and not self._closed:
            self._fit.schedule()

    def close(self) -> None:
        """Close the widget (a running trace is cancelled)."""
        if "_lock" in self.__dict__:
            self.cancel_verify()
            with self._lock:
                self._closed = True
                self._scaling.supersede()
        super().close()

    # ----- what the panels use of the widget (``host.WidgetHost``) --------------------------------------
    def _trait(self, name: PanelTrait) -> Any:
        """The current value of a panel's trait."""
        return getattr(self, name)

    def _publish(self, name: PanelTrait, value: Any) -> None:
        """Set a panel's trait (under the lock); nothing is sent when the value did not change."""
        if value != getattr(self, name):
            setattr(self, name, value)

    # ----- Python API -----------------------------------------------------------------------------------
    @property
    def scenario(self) -> Scenario:
        """The last valid scenario."""
        return self._scenario

    @scenario.setter
    def scenario(self, value: Scenario | Mapping[str, Any]) -> None:
        """Replace the whole scenario (raises ScenarioError if it is invalid; the widget shows it too)."""
        data = value.to_dict() if isinstance(value, Scenario) else dict(value)
        exc = self._submit(data, relative=False)
        if exc is not None:
            raise exc

    @property
    def estimate(self) -> Estimate:
        """The estimate of the last valid scenario."""
        return self._estimate

    @property
    def frame(self) -> Any:
        """The breakdown as a pandas DataFrame (rank, stage, moment, category, item, bytes, gib, counter, formula)."""
        return self._estimate.frame

    @property
    def time_frame(self) -> Any:
        """Where the modelled step time goes as a pandas DataFrame (category, item, seconds, share, formula)."""
        return self._estimate.time_frame

    def set(self, **changes: Any) -> MemSim:
        """Change scenario keys like the controls do (``parallel``/``lora`` accept partial dicts); raises if invalid."""
        explicit = frozenset(flatten(changes))
        data = drop_carried_unknown(merge(self.scenario_data, changes), self.scenario_data, explicit)
        exc = self._submit(data, explicit=explicit)
        if exc is not None:
            raise exc
        return self

    def chart(self) -> Any:
        """The breakdown chart (Altair): stacked categories per rank, capacity line and headroom band."""
        return charts_mod.breakdown_chart(self._estimate, self.headroom)

    def scaling_chart(self) -> Any:
        """The "how it scales" chart (Altair): memory against micro-batch and sequence length."""
        return charts_mod.scaling_chart(self._estimate, self.headroom)

    def time_chart(self) -> Any:
        """The step-time chart (Altair): one bar of where a step's modelled seconds go, by category."""
        from memsim_widget.charts.times import time_chart

        return time_chart(self._estimate)

    def save_chart(self, path: str | Path, which: str = "breakdown", scale_factor: float = 2.0) -> Path:
        """Save a chart (``breakdown``, ``scaling`` or ``time``) as .png, .svg, .pdf, .html or .json (vl-convert)."""
        charts = {"breakdown": self.chart, "scaling": self.scaling_chart, "time": self.time_chart}
        if which not in charts:
            raise ValueError(f"which must be one of {', '.join(charts)}, got {which!r}")
        path = Path(path)
        kwargs = {"scale_factor": scale_factor} if path.suffix.lower() == ".png" else {}
        charts[which]().save(str(path), **kwargs)
        return path

    # ----- "Verify with trace" (``trace_panel``) --------------------------------------------------------
    def verify(self, wait: bool = True, timeout: float | None = None) -> Any:
        """Trace the current scenario in the background and show traced vs simulated bytes in the widget.

        ``wait=True`` blocks until the trace is done and returns its report (``memsim_widget.trace.api.
        trace_report``: ``peak_tensor_bytes``, ``components``, ``timeline``, ``top``, ``simulated``, ...), also
        kept as ``trace_report``; ``wait=False`` returns a ``concurrent.futures.Future`` of it. Raises
        ``ScenarioError`` when the scenario cannot be traced here (the reason the button shows), the trace's
        own error if it fails, and ``TraceCancelled`` if it was cancelled. Interrupting the wait cancels it.
        A trace of the same scenario already running is reused; one of another scenario is cancelled first.
        """
        return self._trace.verify(wait, timeout)

    def wait_calibration(self, timeout: float | None = None) -> bool:
        """Wait until a background calibration (a front-end edit to a model calibrated from traces) is published;
        False if it is still running after ``timeout`` seconds. True at once when none runs."""
        job = self._calibration.job
        return job is None or job.done.wait(timeout)

    def wait_scaling(self, timeout: float | None = None) -> bool:
        """Wait until the scaling chart and summary of a front-end edit, computed in the background
        (``scaling_panel``), are published; False if still computing after ``timeout`` seconds. True at once when
        none is pending (Python's ``set`` and ``scenario =`` compute them in place)."""
        job = self._scaling.job
        return job is None or job.done.wait(timeout)

    def cancel_verify(self) -> bool:
        """Cancel the running trace (it stops at its next module call); False when none is running."""
        return self._trace.cancel()

    @property
    def trace_report(self) -> dict[str, Any] | None:
        """The report of the last finished trace (None before the first); ``trace["stale"]`` says if it is
        of another scenario than the current one."""
        return self._trace.report

    # ----- "Make it fit" (``fit_panel``, ``layouts_panel``) ---------------------------------------------
    def recommend(self) -> Recommendation:
        """What makes the current scenario fit at the widget's headroom (``memsim_widget.plan.recommend``).

        Blocks (10-150 ms; cached per scenario and headroom) and shows the result in the "Make it fit" panel
        too. ``.changes`` are the smallest fixing changes, ``.singles`` each lever alone, ``.max_micro_batch``,
        ``.max_seq_len`` and ``.min_gpus`` how far the scenario goes. Raises what ``recommend`` raises.
        """
        return self._fit.recommend()

    def apply_recommendation(self, index: int = 0, kind: str = "change") -> MemSim:
        """Apply entry ``index`` of ``recommend()`` as an edit would (controls, verdict and charts follow).

        ``kind``: ``change`` (a fixing change, 0 = the recommended one), ``lever`` (a single lever),
        ``max_micro_batch``, ``max_seq_len``, ``min_gpus``, ``max_micro_batch_searched``,
        ``max_seq_len_searched`` (the cheapest layout of the same GPUs reaching the largest) or ``min_gpus_searched``
        (the cheapest layout and knobs on the fewest GPUs). Raises ``ScenarioError`` when there is no such
        entry (e.g. no change fits).
        """
        self.scenario = fit_target(self.recommend(), kind, index)
        return self

    def plan_layouts(self, gpus: int | tuple[int, int] | list[int] | None = None, **kwargs: Any) -> Plan:
        """Search layouts and memory knobs for the current model and GPU type (``memsim_widget.plan.plan``).

        ``gpus``: a count, list or ``(low, high)`` range (default: the scenario's GPU count). ``kwargs`` go to
        ``plan`` (``global_batch_tokens``, ``space``, ``top``). Blocks (0.1-0.5 s typically), shows the best
        candidates and the candidates chart in the panel, and returns the ``Plan`` (``.frame``, ``.summary()``).
        """
        return self._layouts.search(gpus, kwargs)

    def apply_layout(self, rank: int = 0) -> MemSim:
        """Apply the ``rank``-th best candidate (0 = best) of the last layout search as an edit would.

        Searches first (same GPU counts as last time) when there was no search or it is stale. Raises
        ``ScenarioError`` when no candidate has that rank (e.g. nothing fits).
        """
        self.scenario = self._layouts.candidate(rank)
        return self

    # ----- compare (``compare_panel``) ------------------------------------------------------------------
    def pin(self, name: str | None = None) -> MemSim:
        """Pin the current (last valid) scenario under ``name`` (default ``pin N``); raises if it is refused."""
        self._compare_panel.pin(name)
        return self

    def unpin(self, which: int | str = -1) -> MemSim:
        """Remove a pin by position or name (default the last one)."""
        self._compare_panel.unpin(which)
        return self

    @property
    def pin_names(self) -> list[str]:
        """The pins' names, in pinning order."""
        return self._compare_panel.names

    def compare(self) -> Comparison:
        """The pins and the current scenario side by side (``memsim_widget.compare``); raises without pins."""
        return self._compare_panel.compare()

    # ----- launch config (``export_panel``) --------------------------------------------------------------
    def export_config(self, fmt: str) -> dict[str, str]:
        """The launch-config files of the current scenario in one format: ``{file name: text}``."""
        return self._export.files(fmt)

    def import_config(self, paths: str | Path | Sequence[str | Path], fmt: str = "auto") -> list[str]:
        """Show the scenario of your launch config files (``memsim_widget.import_config``); returns the memory
        settings the files did not give, one line each (also shown under "open a config")."""
        paths = [paths] if isinstance(paths, str | Path) else list(paths)
        return self._import.apply(paths, fmt).unread

    def to_json(self, indent: int | None = 2) -> str:
        """The last valid scenario as JSON (``MemSim.from_json`` reads it back)."""
        return self._scenario.to_json(indent=indent)

    @classmethod
    def from_json(cls, text_or_path: str | Path, **kwargs: Any) -> MemSim:
        """A widget for a scenario JSON file or text."""
        return cls(Scenario.from_json(text_or_path), **kwargs)

    def __repr__(self) -> str:
        """Deterministic one-liner: model, GPU, verdict, peak and its moment (no memory address)."""
        est = self._estimate
        text = (
            f"MemSim({charts_mod.model_label(self._scenario.model)} on "
            f"{charts_mod.gpu_label(self._scenario.gpu)}: {est.verdict(self.headroom)}, "
            f"peak {est.device_total_bytes / GiB:.1f} GiB at {est.peak_phase}"
        )
        if self.error:
            text += f"; rejected {self.error_field or 'input'}"
        return text + ")"
