"""The rollout phase of online RL (GRPO, PPO): generation and scoring before the training step."""

from __future__ import annotations

from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.items import Item
from memsim_widget.engine.states import StateBudget
from memsim_widget.engine.timeline import Moment
from memsim_widget.scenario import Scenario


def rollout_moments(
    ctx: Context, sc: Scenario, stage: Stage, states: StateBudget, overhead: list[Item]
) -> list[Moment]:
    return []
