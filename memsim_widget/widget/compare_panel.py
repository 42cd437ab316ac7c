"""The compare panel: up to three pinned scenarios beside the current one, and the panel's controller.

The front end writes ``pins`` ("Pin" appends the current ``scenario_data``, a remove button drops an entry);
Python checks, names and estimates each pin once, when it is pinned. An edit recomputes only the current
estimate, then the comparison of at most four estimates (``memsim_widget.comparison``): the ``comparison``
trait holds the pins' summaries, the headline numbers, the fields that differ and the chart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memsim_widget.charts.comparison import compare_spec
from memsim_widget.comparison import MAX_SCENARIOS, Comparison, compare, value_text
from memsim_widget.engine.core import estimate as run_estimate
from memsim_widget.engine.estimate import Estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.units import fmt_bytes

if TYPE_CHECKING:
    from memsim_widget.widget.host import WidgetHost

#: Pinned scenarios at most (with the current one, a comparison holds four).
MAX_PINS = MAX_SCENARIOS - 1
#: The current scenario's name in the comparison.
CURRENT = "current"


def pin_summary(est: Estimate, headroom: float) -> str:
    """A pin in one line: peak per GPU, verdict, step time."""
    return f"{fmt_bytes(est.device_total_bytes)}, {est.verdict(headroom)}, {est.step_time_s:.3g} s/step"


def build_compare_view(cmp: Comparison) -> dict[str, Any]:
    """The ``view`` of the ``comparison`` trait: headline rows, the differing fields (cells that differ from the
    last scenario, the current one, flagged ``changed``) and the chart's Vega-Lite spec."""
    rows = [
        {
            "name": h["scenario"],
            "verdict": h["verdict"],
            "fits": h["fits"],
            "peak": fmt_bytes(h["device_total_bytes"]),
            "step_time": f"{h['step_time_s']:.3g} s",
            "tokens_per_second": f"{h['tokens_per_second_per_gpu']:,.0f}",
            "mfu": f"{h['mfu']:.1%}",
        }
        for h in (cmp.headline(n, e) for n, e in zip(cmp.names, cmp.estimates, strict=True))
    ]
    differences = []
    for field, by_name in cmp.differences.items():
        values = list(by_name.values())
        differences.append(
            {
                "field": field,
                "values": [value_text(field, v) for v in values],
                "changed": [v != values[-1] for v in values],
            }
        )
    return {"names": list(cmp.names), "rows": rows, "differences": differences, "chart": compare_spec(cmp)}


def json_key(data: Mapping[str, Any]) -> str:
    """A scenario dict as canonical text, to find a pin again."""
    return json.dumps(data, sort_keys=True, default=str)


def _free_name(taken: set[str]) -> str:
    """The first ``pin N`` not taken."""
    n = 1
    while f"pin {n}" in taken:
        n += 1
    return f"pin {n}"


def _pin_name(entry: Mapping[str, Any], taken: set[str]) -> str:
    """The entry's own name when it is a free, non-empty string other than ``current``; else ``pin N``."""
    name = entry.get("name")
    if isinstance(name, str) and name.strip() and name != CURRENT and name not in taken:
        return name.strip()
    return _free_name(taken)


class CompareController:
    """The pins and their comparison for a widget (its ``WidgetHost``): the pinned scenarios and estimates.

    ``MemSim.pin``, ``unpin``, ``pin_names`` and ``compare`` delegate here, and so does its ``pins`` observer
    (traitlets binds observers of the widget class only). Tests replace ``run_estimate`` in this module.
    """

    def __init__(self, host: WidgetHost) -> None:
        """No pins yet: ``(name, scenario dict, estimate)`` per pin."""
        self.host = host
        self.pinned: list[tuple[str, dict[str, Any], Estimate]] = []
        self.error: ScenarioError | None = None  # why the last pin was refused
        self._writing = False  # the controller writes ``pins`` itself: its observer call is ignored

    @staticmethod
    def initial() -> dict[str, Any]:
        """The ``comparison`` trait of a new widget."""
        return {"error": "", "max_pins": MAX_PINS, "pins": [], "view": None}

    def written(self, entries: Any) -> None:
        """The front end (or Python) wrote the pins: check, name and estimate new ones, then compare."""
        if self._writing:
            return
        with self.host._lock:
            self._take(entries)
            self.update()

    def _take(self, entries: Any) -> None:
        """Keep the valid, distinct pins (three at most); the first rejected one's reason goes to ``error``."""
        known = {json_key(d): (d, est) for _, d, est in self.pinned}
        pinned: list[tuple[str, dict[str, Any], Estimate]] = []
        errors: list[ScenarioError] = []
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            try:
                data, est = self._estimate(entry, i, known)
            except ScenarioError as exc:
                errors.append(exc)
                continue
            twin = next((n for n, d, _ in pinned if d == data), None)
            if twin is not None:
                errors.append(ScenarioError("pins", f"this scenario is pinned already ({twin})"))
            elif len(pinned) == MAX_PINS:
                errors.append(
                    ScenarioError("pins", f"at most {MAX_PINS} pinned scenarios (4 with the current one)")
                )
            else:
                pinned.append((_pin_name(entry, {n for n, _, _ in pinned}), data, est))
        self.pinned, self.error = pinned, (errors[0] if errors else None)
        self._writing = True
        try:
            self.host._publish("pins", [{"name": n, "scenario": d} for n, d, _ in pinned])
        finally:
            self._writing = False

    @staticmethod
    def _estimate(
        entry: Any, index: int, known: Mapping[str, tuple[dict[str, Any], Estimate]]
    ) -> tuple[dict[str, Any], Estimate]:
        """A pin's resolved scenario dict and estimate: reused when already pinned, else estimated now."""
        if not isinstance(entry, Mapping) or not isinstance(entry.get("scenario"), Mapping):
            raise ScenarioError(f"pins[{index}]", 'must be {"name": ..., "scenario": {...}}')
        hit = known.get(json_key(entry["scenario"]))
        if hit is not None:
            return hit
        try:
            sc = Scenario.from_dict(entry["scenario"])
            return sc.to_dict(), run_estimate(sc)
        except ScenarioError as exc:
            raise ScenarioError(f"pins[{index}].{exc.field}", exc.message) from None

    def update(self) -> None:
        """Update the ``comparison`` trait (under the lock) from the pins, the current estimate and the headroom."""
        headroom = self.host.headroom
        view = None
        if self.pinned:
            ests = [est for _, _, est in self.pinned] + [self.host.estimate]
            names = [n for n, _, _ in self.pinned] + [CURRENT]
            view = build_compare_view(compare(ests, names, headroom=headroom))
        self.host._publish(
            "comparison",
            {
                "error": str(self.error or ""),
                "max_pins": MAX_PINS,
                "pins": [{"name": n, "summary": pin_summary(est, headroom)} for n, _, est in self.pinned],
                "view": view,
            },
        )

    @property
    def names(self) -> list[str]:
        """``MemSim.pin_names``: the pins' names, in pinning order."""
        return [n for n, _, _ in self.pinned]

    def pin(self, name: str | None) -> None:
        """``MemSim.pin``: pin the last valid scenario under ``name``; raises if it is refused."""
        if name is not None and (
            not isinstance(name, str) or not name.strip() or name.strip() in [*self.names, CURRENT]
        ):
            taken = ", ".join([*self.names, CURRENT])
            raise ScenarioError("name", f"must be a new non-empty name; taken: {taken}, got {name!r}")
        host = self.host
        with host._lock:
            host._publish("pins", [*host._trait("pins"), {"name": name or "", "scenario": host._valid}])
            if self.error is not None:
                raise self.error

    def unpin(self, which: int | str) -> None:
        """``MemSim.unpin``: remove a pin by position or name."""
        names = self.names
        index = names.index(which) if which in names else which
        if not isinstance(index, int) or isinstance(index, bool) or not -len(names) <= index < len(names):
            raise ScenarioError("pin", f"{which!r} is not pinned; pinned: {', '.join(names) or 'none'}")
        pins = self.host._trait("pins")
        self.host._publish("pins", [p for i, p in enumerate(pins) if i != index % len(names)])

    def compare(self) -> Comparison:
        """``MemSim.compare``: the pins and the current scenario side by side; raises without pins."""
        if not self.pinned:
            raise ScenarioError(
                "pins", "nothing is pinned: pin a scenario first (MemSim.pin or the Pin button)"
            )
        ests = [est for _, _, est in self.pinned] + [self.host.estimate]
        return compare(ests, [*self.names, CURRENT], headroom=self.host.headroom)
