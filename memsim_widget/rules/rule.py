"""One scenario rule as data: the field it names, when it is broken, its message, and what the widget does.

A rule's predicates read a *view*: a mapping from the scenario's dotted keys (``parallel.tp``, ``rl.reference``,
``objective`` resolved to ``sft`` when unset) to values, plus ``arch`` (the resolved ``Architecture``),
``linear_modules``, ``adapters`` and ``context.images_per_sample`` (resolved) where the reader knows them. The scenario check passes the validated values,
the widget the raw (possibly invalid) values of its controls, the planner numpy arrays for the keys it varies
(``plan.space.candidate_view``). So a predicate combines the keys the planner varies with ``&``, ``|`` and
comparisons only (never ``and``/``or``/``not``/``in``), and a reader that cannot judge a rule from its view (a key
it lacks, a value of the wrong type) leaves the rule to the scenario check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memsim_widget.errors import ScenarioError
from memsim_widget.fast_dataclass import dataclass

View = Mapping[str, Any]
#: Where a rule is checked: ``parallel`` (``ParallelConfig``), ``scenario`` (``Scenario``'s own keys),
#: ``objective`` (the objective and its ``rl`` block), ``model`` (``engine.context.Context``, against the model),
#: ``ssm`` (state-space layers, with the engine's other Mamba refusals); ``inert``: never an error -- the key is
#: accepted but has no effect, so the widget disables (and may reset) its control.
STAGES = ("parallel", "scenario", "objective", "model", "ssm", "inert")
#: What a reader catches when a raw view cannot answer a predicate (the scenario check reports the bad value).
UNJUDGED = (KeyError, TypeError, AttributeError, ValueError, ZeroDivisionError, IndexError)


@dataclass(frozen=True)
class Rule:
    """A rule on ``field``: ``broken(view)`` says the view violates it, ``message`` (text, or text from the
    view) is the error the scenario check raises and the reason the widget shows on the disabled control.

    ``reset(view)``: the value the widget sets ``field`` to when a change broke the rule (None: no reset, the
    error shows). ``disabled(view)``: the control cannot take any value but its neutral one now.
    ``refused(view)``: the values of the control that would break the rule now (the widget greys them out).
    """

    name: str
    field: str
    stage: str
    broken: Callable[[View], Any]
    message: str | Callable[[View], str]
    reset: Callable[[View], Any] | None = None
    disabled: Callable[[View], Any] | None = None
    refused: Callable[[View], list[Any]] | None = None

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"rule {self.name}: stage {self.stage!r} is not one of {STAGES}")

    def check(self, view: View) -> None:
        """Raise the rule as a ``ScenarioError`` naming its field where ``view`` breaks it."""
        if self.broken(view):
            raise ScenarioError(self.field, self.text(view))

    def text(self, view: View) -> str:
        """The rule's message for ``view``."""
        return self.message if isinstance(self.message, str) else self.message(view)

    def judge(self, predicate: Callable[[View], Any] | None, view: View) -> bool | None:
        """``predicate(view)`` as a bool; None where the view cannot answer it (a key it lacks, a bad value)."""
        if predicate is None:
            return False
        try:
            return bool(predicate(view))
        except UNJUDGED:
            return None


def inert(name: str, field: str, when: Callable[[View], Any], message: str | Callable[[View], str],
          neutral: Any = None, *, resets: bool = False) -> Rule:  # fmt: skip
    """A rule that is never an error: ``field`` has no effect ``when`` it holds, so its control is disabled
    (and, with ``resets``, set back to ``neutral``)."""
    return Rule(
        name,
        field,
        "inert",
        broken=(lambda v: when(v) & (v[field] != neutral)) if resets else (lambda v: False),
        message=message,
        reset=(lambda v: neutral) if resets else None,
        disabled=when,
    )
