"""What a panel may use of the widget that owns it: the ``WidgetHost`` protocol, which ``MemSim`` implements.

The panels (``trace_panel``, ``fit_panel``, ``layouts_panel``, ``compare_panel``, ``export_panel``) are controller
objects that
``MemSim`` owns and calls; each holds its own state and sees the widget only through these members, so none
of them imports ``memsim`` (the widget imports them). The underscored members are the package's, not users'.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, runtime_checkable

from memsim_widget.engine.estimate import Estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

#: The traits the panels read (``_trait``) and write (``_publish``); the update path owns all the others.
PanelTrait = Literal[
    "trace",
    "trace_view",
    "fit",
    "fit_open",
    "layouts",
    "pins",
    "comparison",
    "export",
    "calibration",
    "config_import",
    "measure",
]


@runtime_checkable
class WidgetHost(Protocol):
    """The widget as its panels see it: the current scenario, its estimate and headroom, the panels' traits,
    the edit path and the lock.

    Every trait write happens under ``_lock`` (a re-entrant lock: the panels' background threads write traits
    too); a panel's ``finish`` of a background job already runs under it.
    """

    #: The widget's lock (re-entrant): held for every trait write and every read of a consistent state.
    _lock: threading.RLock
    #: The last valid scenario as a dict (``scenario_data`` unless a rejected input is shown).
    _valid: dict[str, Any]

    @property
    def scenario_data(self) -> Mapping[str, Any]:
        """The scenario shown (read only): ``_valid``, or a rejected input completed from it (what the controls
        show)."""
        ...

    #: Why the input shown is rejected; None when the shown scenario is the valid one.
    _last_exc: ScenarioError | None
    #: Whether the widget is closed: panels then start no work and publish nothing more.
    _closed: bool

    @property
    def scenario(self) -> Scenario:
        """The last valid scenario."""
        ...

    @property
    def estimate(self) -> Estimate:
        """The estimate of the last valid scenario."""
        ...

    @property
    def headroom(self) -> float:
        """Share of GPU memory kept free for the verdict."""
        ...

    def _trait(self, name: PanelTrait) -> Any:
        """The current value of a panel's trait."""
        ...

    def _publish(self, name: PanelTrait, value: Any) -> None:
        """Set a panel's trait (under the lock); nothing is sent when the value did not change."""
        ...

    def _submit(
        self,
        data: Mapping[str, Any],
        relative: bool = True,
        explicit: frozenset[str] = frozenset(),
        ready: Any = None,
        defer_scaling: bool | None = None,
    ) -> ScenarioError | None:
        """Apply a scenario dict as an edit does; the ScenarioError that rejected it, None when it was valid.
        ``ready``: the scenario's estimate, already computed (a background calibration's); ``defer_scaling``:
        the scaling view is left to a background job (``scaling_panel``), as for an edit from the front end."""
        ...

    def _reject(self, data: dict[str, Any], exc: ScenarioError) -> None:
        """Show ``data`` as rejected by ``exc`` (under the lock), keeping the last valid result."""
        ...

    def hold_sync(self) -> AbstractContextManager[Any]:
        """Send the traits set inside the block to the front end together, at its end."""
        ...
