"""A scenario with dotted keys set (shared by the planner's test modules)."""

from __future__ import annotations

from typing import Any

from memsim_widget.scenario import Scenario


def applied(scenario: Scenario, changes: dict[str, Any]) -> Scenario:
    """``scenario`` with dotted keys set, through the public dict form."""
    data = scenario.to_dict()
    data.pop("num_gpus")
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        target = data
        for p in parents:
            target = target[p]
        target[leaf] = value
    return Scenario.from_dict(data)
