"""The planner: which layouts and knobs fit a GPU, what to change when a run does not, how memory scales.

``plan`` searches layouts (dp/tp/pp/cp/ep) and memory knobs and ranks what fits by modelled cost,
time (``engine/speed/step_time.py``, the same model as ``estimate``'s step time) or memory;
``recommend`` lists the smallest changes that make one scenario fit; ``gpu_scaling`` shows memory per GPU
as data parallelism grows, per ZeRO stage. ``plan`` and ``gpu_scaling`` evaluate candidates with
``plan.vector``, the engine's timeline on numpy arrays, which agrees with ``estimate`` to the byte;
``recommend`` calls ``estimate`` for each combination it tries.
"""

from memsim_widget.plan.gpu_scaling import gpu_scaling
from memsim_widget.plan.recommend import Change, Recommendation, recommend
from memsim_widget.plan.search import Plan, plan
from memsim_widget.plan.space import SearchSpace

__all__ = ["Change", "Plan", "Recommendation", "SearchSpace", "gpu_scaling", "plan", "recommend"]
