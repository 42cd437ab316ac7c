"""The scenario rules, each written once: the field it names, when it is broken, its message, the widget's reset
and disabled reason, and (through the same predicate) what the planner leaves out of its space.

Readers: ``ParallelConfig`` / ``Scenario`` / ``engine.context.Context`` raise ``check(stage, view)``;
``widget.controls.normalize`` applies each broken rule's ``reset``; ``widget.controls.disabled_controls`` shows
each rule's message where its control is ``disabled`` (or its values ``refused``); ``plan.space.candidates``
keeps only the candidates that break no rule. Modules by where a rule is checked: ``parallel`` (the layout
alone), ``step`` (the step's keys), ``objective`` (the ``rl`` block), ``model`` (against the model),
``multimodal`` (against a multimodal model). Rules the engine checks inside its formulas (the family- and
precision-specific refusals in ``engine/activations.py`` and ``engine/activations/calibrated.py``, the calibrated model's
objectives in ``engine/rl/objectives.py``) stay there: the planner probes them through the engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from memsim_widget.rules import model, multimodal, objective, parallel, step
from memsim_widget.rules.model import available_impl
from memsim_widget.rules.rule import STAGES, UNJUDGED, Rule, View, inert

__all__ = ["RULES", "STAGES", "UNJUDGED", "Rule", "ScenarioView", "View", "available_impl", "check", "inert",
           "stage_rules"]  # fmt: skip

#: Every rule, in the order the checks raise them and the widget applies them.
RULES: tuple[Rule, ...] = (*parallel.RULES, *step.RULES, *objective.RULES, *model.RULES, *multimodal.RULES)


def stage_rules(stage: str) -> tuple[Rule, ...]:
    """The rules checked at ``stage``, in table order."""
    return tuple(r for r in RULES if r.stage == stage)


def check(stage: str, view: View) -> None:
    """Raise the first rule of ``stage`` that ``view`` breaks, as a ``ScenarioError`` naming its field."""
    for rule in RULES:
        if rule.stage == stage:
            rule.check(view)


class ScenarioView(Mapping[str, Any]):
    """A scenario (or a ``ParallelConfig``, as ``parallel``) as a rules view: dotted keys read its attributes,
    ``rl.*`` its ``rl_config``, ``objective`` the resolved name; ``extra`` adds keys (``arch``, ``adapters``)."""

    def __init__(self, scenario: Any = None, *, parallel: Any = None, **extra: Any) -> None:
        self._sc = scenario
        self._par = parallel if parallel is not None else getattr(scenario, "parallel", None)
        self._extra = extra

    def __getitem__(self, key: str) -> Any:
        if key in self._extra:
            return self._extra[key]
        section, _, sub = key.partition(".")
        try:
            if section == "parallel" and sub:
                return getattr(self._par, sub)
            if self._sc is None:
                raise KeyError(key)
            if key == "objective":
                return self._sc.objective_name
            if sub:
                return getattr(self._sc.rl_config if section == "rl" else getattr(self._sc, section), sub)
            return getattr(self._sc, key)
        except AttributeError as exc:
            raise KeyError(key) from exc

    def __iter__(self) -> Iterator[str]:
        return iter(self._extra)

    def __len__(self) -> int:
        return len(self._extra)
