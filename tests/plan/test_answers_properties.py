"""Properties of the answers users act on, over random bases (hypothesis, few examples: seconds).

- If ``plan`` lists a fit on the scenario's own GPUs (its global batch and method kept), ``recommend`` of the
  scenario finds a fit that keeps the job, no slower (modelled step time per token) than the planner's best
  (within ``PLANNER_GAIN``: a pick 2% faster changing many knobs is not offered over a simpler fix).
- Every recommendation, applied to the scenario through its public dict form, fits when estimated again.
- Every listed pick of a plan exports, or is refused in one line naming a field; a plan ranked for a format
  (``for_export``) lists only picks that export.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.export import FORMATS, export
from memsim_widget.plan import plan, recommend
from memsim_widget.plan.recommend import PLANNER_GAIN, _step_time
from memsim_widget.scenario import Scenario

MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b", "qwen3-4b")
GPUS = ("rtx-4090", "a100-40gb", "l4")


@st.composite
def bases(draw: st.DrawFn) -> dict[str, Any]:
    """A training job on a small cluster of one card type, often too big for it as it is."""
    return {
        "model": draw(st.sampled_from(MODELS)),
        "gpu": draw(st.sampled_from(GPUS)),
        "method": draw(st.sampled_from(["full", "full", "lora", "qlora"])),
        "seq_len": draw(st.sampled_from([1024, 2048, 4096, 8192])),
        "micro_batch_size": draw(st.sampled_from([1, 2, 4, 8])),
        "parallel": {"dp": draw(st.sampled_from([1, 2, 4]))},
    }


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


SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(base=bases())
def test_when_plan_lists_a_fit_recommend_finds_one_no_slower(base):
    sc = Scenario.from_dict(base)
    par = sc.parallel
    tokens = par.dp * sc.micro_batch_size * sc.grad_accum_steps * Context(sc).seq_len
    p = plan(base=sc, gpus=par.world_size, global_batch_tokens=tokens, top=1, widen=False)
    rec = recommend(sc)
    if not p.listed:
        return
    if rec.fits:
        return
    keep = [c for c in rec.changes if not c.changes_the_job]
    assert keep, "the planner found a fit on these GPUs: recommend must find one that keeps the job"
    best = _step_time(p.best()) / _step_time(sc)
    assert min(c.slowdown for c in keep) * PLANNER_GAIN <= best * (1 + 1e-9)


@SETTINGS
@given(base=bases())
def test_every_recommendation_applied_is_confirmed_by_estimate(base):
    rec = recommend(base)
    for c in rec.changes:
        data = json.loads(json.dumps(c.to_dict()))  # what --json prints
        after = estimate(applied(rec.scenario, data["changes"]))
        assert after.device_total_bytes == data["device_total_bytes_after"]
        assert after.fits(headroom=rec.headroom)
    if rec.min_gpus is not None:
        assert estimate(Scenario.from_dict(rec.min_gpus["scenario"])).fits(headroom=rec.headroom)
    if rec.smallest_card is not None:
        assert estimate(rec.scenario.replace(gpu=rec.smallest_card["gpu"])).fits(headroom=rec.headroom)
    if not rec.fits and not rec.changes:
        assert rec.bound  # what bounds it, in words


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=bases(), gpus=st.sampled_from([1, 2, 8]), fmt=st.sampled_from(sorted(FORMATS)))
def test_each_listed_pick_exports_or_names_the_field(base, gpus, fmt):
    p = plan(base=base, gpus=gpus, top=5)
    for i in p.ranking[:5].tolist():
        try:
            files = export(p.scenario(i), fmt, p.estimate(i))
        except ScenarioError as e:
            assert e.field and "\n" not in str(e)
        else:
            assert files and all(text for text in files.values())
    ranked = p.for_export(fmt)
    for i in ranked.ranking[:5].tolist():
        assert export(ranked.scenario(i), fmt, ranked.estimate(i))
    assert ranked.listed + sum(v["count"] for v in ranked.left_out.values()) == p.listed
