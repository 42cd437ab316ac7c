"""The ``MemSim`` widget: its traits, the update that recomputes them from the scenario, and the Python API.

Python is the single source of truth: the front end only writes ``scenario_data`` (and ``headroom``,
``fit_open``) and sends messages; every derived trait is recomputed here. The panels' methods come from mixins
(``trace_panel``, ``fit_panel``, ``layouts_panel``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from memsim_widget import charts as charts_mod
from memsim_widget.engine.core import estimate as run_estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.scenario import Scenario
from memsim_widget.time_charts import time_spec
from memsim_widget.widget.assets import _asset, vega_bundle
from memsim_widget.widget.compare_panel import MAX_PINS, ComparePanel
from memsim_widget.widget.controls import build_options, normalize
from memsim_widget.widget.export_panel import ExportPanel
from memsim_widget.widget.fit_panel import FitPanel
from memsim_widget.widget.layouts_panel import LayoutsPanel
from memsim_widget.widget.result import GiB, build_result
from memsim_widget.widget.scenario_edits import _defaults, _known, changed_keys, flatten, merge
from memsim_widget.widget.trace_panel import TracePanel


def _json_text(value: Any, widget: Any) -> str:
    """Send a large derived trait as JSON text: ipywidgets then skips walking it for binary buffers (~4 ms)."""
    return json.dumps(value, separators=(",", ":"))


class MemSim(TracePanel, FitPanel, LayoutsPanel, ComparePanel, ExportPanel, anywidget.AnyWidget):
    """GPU-memory simulator widget: controls for a ``Scenario``, the verdict, breakdown, scaling and table.

    The "Verify with trace", "Make it fit", compare and launch-config panels' methods come from the ``TracePanel``,
    ``FitPanel``, ``LayoutsPanel``, ``ComparePanel`` and ``ExportPanel`` mixins.
    """

    _esm = _asset("widget.js")
    _css = _asset("widget.css")

    #: The scenario as JSON (every key resolved when valid): the single source of truth for the controls.
    scenario_data = traitlets.Dict().tag(sync=True)
    #: The controls to draw (``controls``: key, label, kind, group; ``controls.CONTROLS``), allowed values per
    #: control, presets, GPUs, slider stops, and which controls/values are disabled.
    #: (``options``, ``result`` and ``charts`` are dicts in Python and reach the browser as JSON text.)
    options = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: The last valid result: verdict, peaks with counters, bottleneck, per-rank bytes, breakdown rows.
    result = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Vega-Lite specs: ``breakdown``, ``scaling`` and ``time`` (where a step's modelled time goes).
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
    comparison = traitlets.Dict({"error": "", "max_pins": MAX_PINS, "pins": [], "view": None}).tag(
        sync=True, to_json=_json_text
    )

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
        self._init_trace()
        self._init_fit()
        self._init_layouts()
        self._init_compare()
        self.last_update_ms = 0.0
        headroom = self._check_headroom({"value": headroom})
        super().__init__(
            scenario_data=self._valid,
            options=build_options(self._valid),
            headroom=headroom,
            _vega_js=vega_bundle() if charts_js else "",
            trace={"state": "idle", "progress": {}, "error": "", **self._trace_flags()},
            fit={
                "state": "idle",
                "error": "",
                "id": 0,
                "ms": None,
                "stale": False,
                "rejected": False,
                "view": None,
            },
            layouts={
                "state": "idle",
                "error": "",
                "id": 0,
                "ms": None,
                "gpus": None,
                "stale": False,
                "stale_keys": [],
                "view": None,
            },  # fmt: skip
            **self._derived(est, headroom),
        )
        self.on_msg(self._on_front_msg)
        self._busy = False

    # ----- trait observers ------------------------------------------------------------------------------
    @traitlets.validate("headroom")
    def _check_headroom(self, proposal: Mapping[str, Any]) -> float:
        """Headroom is a share in [0, 0.9]."""
        value = float(proposal["value"])
        if not 0 <= value <= 0.9:
            raise traitlets.TraitError(f"headroom must be between 0 and 0.9, got {value}")
        return value

    @traitlets.observe("headroom")
    def _on_headroom(self, change: Any) -> None:
        """A new headroom changes the verdict and the charts' band."""
        if not self._busy and hasattr(self, "_estimate"):
            with self._lock, self.hold_sync():
                self._refresh()
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
        self._submit(change["new"])

    @traitlets.observe("pins")
    def _on_pins(self, change: Any) -> None:
        """The front end (or Python) wrote the pins (``ComparePanel``)."""
        self._pins_written(change["new"])

    def set_state(self, sync_data: dict[str, Any]) -> None:
        """Front-end writes apply under the widget's lock (the trace thread writes traits too)."""
        with self._lock:
            super().set_state(sync_data)

    # ----- core update ----------------------------------------------------------------------------------
    def _submit(
        self, data: Mapping[str, Any], relative: bool = True, explicit: frozenset[str] = frozenset()
    ) -> ScenarioError | None:
        """Apply a scenario dict; returns the ScenarioError that rejected it (None when it was valid).

        ``relative``: the dict is the previous scenario with some controls moved, so controls the move made
        inapplicable are reset (``normalize``) and an unchanged ``num_gpus`` follows the new layout; ``explicit``
        keys count as changed even when their value stays (``set(parallel={"tp": 1, "sequence_parallel": True})``).
        Omitted keys take their defaults, as in ``Scenario.from_dict``.
        """
        with self._lock:
            return self._apply(data, relative, explicit)

    def _apply(
        self, data: Mapping[str, Any], relative: bool, explicit: frozenset[str]
    ) -> ScenarioError | None:
        """``_submit`` without the lock."""
        t0 = time.perf_counter()
        if not isinstance(data, Mapping):
            exc = ScenarioError("scenario", f"must be a JSON object, got {type(data).__name__}")
            self._reject({}, exc)
            return exc
        data = merge(_defaults(), data)
        if relative:
            changed = changed_keys(self._valid, data) | explicit
            if "num_gpus" not in changed:
                data["num_gpus"] = None  # derived from the layout unless set on purpose
            data = normalize(data, changed)
        self._busy = True
        try:
            try:
                sc = Scenario.from_dict(data)
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
                self.options = build_options(self._valid)
                self._refresh()
                self._set_trace()
                self._follow_plan()
            return None
        finally:
            self._busy = False
            self.last_update_ms = (time.perf_counter() - t0) * 1000

    def _reject(self, data: dict[str, Any], exc: ScenarioError) -> None:
        """Keep the previous result; show the input as typed (completed from the last valid one) and the error."""
        self._last_exc = exc
        shown = merge(self._valid, _known(data))
        if shown.get("num_gpus") is None:
            shown["num_gpus"] = self._valid["num_gpus"]
        with self.hold_sync():
            self.scenario_data = shown
            self.error = str(exc)
            self.error_field = exc.field
            self.options = build_options(shown)
            self._set_trace()
            self._set_fit()
            self._set_layouts()

    @staticmethod
    def _derived(est: Estimate, headroom: float) -> dict[str, Any]:
        """``result`` and ``charts`` of an estimate at a headroom."""
        scaling = charts_mod.scaling_data(est, headroom)
        return {
            "result": build_result(est, headroom, scaling),
            "charts": {
                "breakdown": charts_mod.breakdown_spec(est, headroom),
                "scaling": charts_mod.scaling_spec(scaling, headroom, est.gpu.name),
                "time": time_spec(est),
            },
        }

    def _refresh(self) -> None:
        """Recompute result and charts from the current estimate and headroom."""
        for name, value in self._derived(self._estimate, self.headroom).items():
            setattr(self, name, value)
        self._set_compare()

    # ----- front-end messages, following changes, closing -----------------------------------------------
    def _on_front_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """Messages from the front end: ``verify``, ``cancel`` (trace); ``fit_apply`` (kind, index, id),
        ``layouts`` (gpus) and ``layout_apply`` (candidate, id) for "Make it fit"; ``export`` (format)."""
        if not isinstance(content, Mapping):
            return
        kind = content.get("type")
        if kind == "verify":
            self._start_trace(strict=False)
        elif kind == "cancel":
            self.cancel_verify()
        elif kind == "fit_apply":
            self._fit_apply_msg(content)
        elif kind == "layouts":
            self._start_layouts(content.get("gpus"))
        elif kind == "layout_apply":
            self._layout_apply_msg(content)
        elif kind == "export":
            self._export_msg(content)

    def _follow_plan(self) -> None:
        """After a change (under the lock): refresh both panels' stale flags; recompute recommendations if open."""
        self._set_fit()
        self._set_layouts()
        if self.fit_open and not self._closed:
            self._schedule_fit()

    def close(self) -> None:
        """Close the widget (a running trace is cancelled)."""
        if "_lock" in self.__dict__:
            self.cancel_verify()
            self._closed = True
        super().close()

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
        exc = self._submit(merge(self.scenario_data, changes), explicit=frozenset(flatten(changes)))
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
        from memsim_widget.time_charts import time_chart

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
