"""The ``MemSim`` Jupyter widget: scenario controls synced to Python, which recomputes estimate, table and charts.

Architecture: one ``anywidget.AnyWidget``. The front end (``js/widget.js``, the esbuild bundle of the ES modules
in ``js/src/``, + ``js/widget.css``, shipped in the wheel as ``memsim_widget/static/``) draws the controls (from
the list in ``options["controls"]``), the verdict, the breakdown table and the charts; the
charts are Vega-Lite specs rendered by vega-embed, which Python hands over once per widget as an ES-module
string bundled by ``vl_convert.javascript_bundle`` (no CDN, no network request). Python is the single source
of truth: the front end only writes ``scenario_data`` (and ``headroom``); every derived trait is recomputed here.

"Verify with trace" (``MemSim.verify`` or the button, which sends a ``{"type": "verify"}`` message) traces the
current scenario in a background thread (``memsim_widget.trace``: two training steps on fake tensors), publishes
its progress in the ``trace`` trait, then shows traced against simulated bytes and the timeline (``trace_view``).
A later scenario change marks that result stale; it never runs on an ordinary update.

"Make it fit" (``fit_open``, ``fit``; ``MemSim.recommend`` / ``apply_recommendation``) shows the planner's
smallest fixing changes (``memsim_widget.plan.recommend``) or, when the scenario fits, how far it can be pushed.
They are computed in a background thread only while the panel is open (on every change then, cached per
scenario), so the ordinary update stays fast. Its "Layouts" part (``layouts``; ``MemSim.plan_layouts`` /
``apply_layout``) runs ``memsim_widget.plan.plan`` on request. Applying either replaces the scenario through
``_submit``, the path of every edit, so controls, verdict and charts follow.

Modules:

* ``memsim``: the ``MemSim`` class (traits, the update, the Python API, the front-end message table); it owns
  one controller per panel and delegates the panels' methods to them;
* ``host``: ``WidgetHost``, what a panel may use of the widget (``MemSim`` implements it; no panel imports
  ``memsim``);
* ``background``: ``BackgroundJob`` and ``JobSlot``, the background run of a trace, recommendations, a layout
  search, a calibration or a scaling view (work outside the lock, publish under it unless superseded);
* ``assets``: the front-end files and the vega-embed bundle;
* ``scenario_edits``: scenario dicts as the controls edit them (dotted keys, diff, merge, defaults);
* ``controls``: which controls apply (``normalize``, ``disabled_controls``: readers of ``memsim_widget.rules``)
  and the ``options`` trait;
* ``result``: the ``result`` trait of an estimate;
* ``trace_runner`` and ``trace_panel``: running a trace, and the "Verify with trace" view and controller;
* ``fit_panel`` and ``layouts_panel``: "Make it fit"'s recommendations and candidate layouts, views and
  controllers;
* ``compare_panel``: the pins and their comparison with the current scenario (``pins``, ``comparison``);
* ``export_panel``: the launch-config files of the current scenario (``export``, ``MemSim.export_config``),
  written by ``memsim_widget.export`` on an ``{"type": "export", "format": F}`` message.
* ``calibration_panel``: a calibrated model's first estimate of a recipe (a dozen tiny traces) run as a background
  job off the update of a front-end edit, with its ``calibration`` trait ("calibrating..." in place).
* ``scaling_panel``: the "how it scales" chart and summary of a front-end edit (up to 22 more estimates) run as a
  background job when not memoised: ``result["scaling"]`` says pending meanwhile (``MemSim.wait_scaling``).

The names below are re-exported here; a test that replaces a function (``run_trace``, ``plan_recommend``,
``plan_search``) or a constant patches the module that looks it up, not this package.
"""

from __future__ import annotations

from memsim_widget.units import GiB
from memsim_widget.widget import _extra  # noqa: F401 -- first: one line saying how to install what is missing
from memsim_widget.widget.assets import VL_CONVERT_VERSION, vega_bundle
from memsim_widget.widget.controls import CUSTOM_DIMS, build_options, disabled_controls, normalize
from memsim_widget.widget.fit_panel import FIT_CACHE, FIT_KINDS, build_fit_view, fit_target, plan_recommend
from memsim_widget.widget.layouts_panel import (
    LAYOUT_POINTS,
    LAYOUT_ROWS,
    LAYOUT_SEARCHED,
    build_layouts_view,
    layouts_stale_keys,
    plan_search,
)
from memsim_widget.widget.memsim import MemSim
from memsim_widget.widget.result import SCALING_PENDING, build_result, scaling_summary
from memsim_widget.widget.scenario_edits import changed_keys, flatten, merge
from memsim_widget.widget.trace_panel import TRACE_POLL_S, build_trace_view
from memsim_widget.widget.trace_runner import (
    TRACE_EXTRA,
    TRACE_STEPS,
    TraceCancelled,
    TraceProbe,
    run_trace,
    trace_check,
)

__all__ = [
    "CUSTOM_DIMS",
    "FIT_CACHE",
    "FIT_KINDS",
    "LAYOUT_POINTS",
    "LAYOUT_ROWS",
    "LAYOUT_SEARCHED",
    "SCALING_PENDING",
    "TRACE_EXTRA",
    "TRACE_POLL_S",
    "TRACE_STEPS",
    "VL_CONVERT_VERSION",
    "GiB",
    "MemSim",
    "TraceCancelled",
    "TraceProbe",
    "build_fit_view",
    "build_layouts_view",
    "build_options",
    "build_result",
    "build_trace_view",
    "changed_keys",
    "disabled_controls",
    "fit_target",
    "flatten",
    "layouts_stale_keys",
    "merge",
    "normalize",
    "plan_recommend",
    "plan_search",
    "run_trace",
    "scaling_summary",
    "trace_check",
    "vega_bundle",
]
