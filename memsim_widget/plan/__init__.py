"""The planner: which layouts and knobs fit a GPU, what to change when a run does not, how memory scales.

``plan`` searches layouts (dp/tp/pp/cp/ep) and memory knobs and ranks what fits by a throughput proxy;
``recommend`` lists the smallest changes that make one scenario fit. Both evaluate candidates with
``plan.vector``, the engine's timeline on numpy arrays, which agrees with ``estimate`` to the byte.
"""

from memsim_widget.plan.recommend import Change, Recommendation, recommend
from memsim_widget.plan.search import Plan, plan
from memsim_widget.plan.space import SearchSpace

__all__ = ["Change", "Plan", "Recommendation", "SearchSpace", "plan", "recommend"]
