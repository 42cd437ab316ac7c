"""The compare panel: up to three pinned scenarios beside the current one, and the ``MemSim`` methods.

The front end writes ``pins`` ("Pin" appends the current ``scenario_data``, a remove button drops an entry);
Python checks, names and estimates each pin once, when it is pinned. An edit recomputes only the current
estimate, then the comparison of at most four estimates (``memsim_widget.comparison``): the ``comparison``
trait holds the pins' summaries, the headline numbers, the fields that differ and the chart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memsim_widget.comparison import MAX_SCENARIOS, Comparison, compare, value_text
from memsim_widget.comparison_charts import compare_spec
from memsim_widget.engine.core import estimate as run_estimate
from memsim_widget.engine.items import fmt_bytes
from memsim_widget.errors import ScenarioError
from memsim_widget.estimate import Estimate
from memsim_widget.scenario import Scenario

if TYPE_CHECKING:
    from memsim_widget.widget.memsim import MemSim

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


class ComparePanel:
    """``MemSim``'s pins and comparison (a mixin: the traits, ``_lock`` and the estimate are MemSim's)."""

    def _init_compare(self) -> None:
        """No pins yet: ``(name, scenario dict, estimate)`` per pin."""
        self._pinned: list[tuple[str, dict[str, Any], Estimate]] = []
        self._pin_error: ScenarioError | None = None
        self._pins_busy = False

    def _pins_written(self, entries: Any) -> None:
        """The front end (or Python) wrote the pins: check, name and estimate new ones, then compare
        (``MemSim``'s ``pins`` observer calls it: traitlets binds observers of the widget class only)."""
        if self._pins_busy or not hasattr(self, "_pinned"):
            return
        with self._lock:
            self._take_pins(entries)
            self._set_compare()

    def _take_pins(self, entries: Any) -> None:
        """Keep the valid, distinct pins (three at most); the first rejected one's reason goes to ``error``."""
        known = {json_key(d): (d, est) for _, d, est in self._pinned}
        pinned: list[tuple[str, dict[str, Any], Estimate]] = []
        errors: list[ScenarioError] = []
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            try:
                data, est = self._pin_estimate(entry, i, known)
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
        self._pinned, self._pin_error = pinned, (errors[0] if errors else None)
        self._pins_busy = True
        try:
            self.pins = [{"name": n, "scenario": d} for n, d, _ in pinned]
        finally:
            self._pins_busy = False

    @staticmethod
    def _pin_estimate(
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

    def _set_compare(self) -> None:
        """Update the ``comparison`` trait (under the lock) from the pins, the current estimate and the headroom."""
        view = None
        if self._pinned:
            ests = [est for _, _, est in self._pinned] + [self._estimate]
            names = [n for n, _, _ in self._pinned] + [CURRENT]
            view = build_compare_view(compare(ests, names, headroom=self.headroom))
        new = {
            "error": str(self._pin_error or ""),
            "max_pins": MAX_PINS,
            "pins": [{"name": n, "summary": pin_summary(est, self.headroom)} for n, _, est in self._pinned],
            "view": view,
        }
        if new != self.comparison:
            self.comparison = new

    # ----- Python API -----------------------------------------------------------------------------------
    def pin(self, name: str | None = None) -> MemSim:
        """Pin the current (last valid) scenario under ``name`` (default ``pin N``); raises if it is refused."""
        if name is not None and (
            not isinstance(name, str) or not name.strip() or name.strip() in [*self.pin_names, CURRENT]
        ):
            taken = ", ".join([*self.pin_names, CURRENT])
            raise ScenarioError("name", f"must be a new non-empty name; taken: {taken}, got {name!r}")
        with self._lock:
            self.pins = [*self.pins, {"name": name or "", "scenario": self._valid}]
            if self._pin_error is not None:
                raise self._pin_error
        return self

    def unpin(self, which: int | str = -1) -> MemSim:
        """Remove a pin by position or name (default the last one)."""
        names = self.pin_names
        index = names.index(which) if which in names else which
        if not isinstance(index, int) or isinstance(index, bool) or not -len(names) <= index < len(names):
            raise ScenarioError("pin", f"{which!r} is not pinned; pinned: {', '.join(names) or 'none'}")
        self.pins = [p for i, p in enumerate(self.pins) if i != index % len(names)]
        return self

    @property
    def pin_names(self) -> list[str]:
        """The pins' names, in pinning order."""
        return [n for n, _, _ in self._pinned]

    def compare(self) -> Comparison:
        """The pins and the current scenario side by side (``memsim_widget.compare``); raises without pins."""
        if not self._pinned:
            raise ScenarioError(
                "pins", "nothing is pinned: pin a scenario first (MemSim.pin or the Pin button)"
            )
        ests = [est for _, _, est in self._pinned] + [self._estimate]
        return compare(ests, [*self.pin_names, CURRENT], headroom=self.headroom)
