"""An estimate does not depend on which scenarios the process estimated before it.

The engine memoises parts across scenarios (``engine/caches/parts_cache``, ``engine/caches/model_rules_cache``) under keys
that leave out the fields a part never reads. A key missing a field the part does read, or a consumer that
mutates a shared part, makes a figure depend on the order of the scenarios: these properties estimate a
sequence of scenarios with warm caches and require each to equal its estimate made with every cache cleared.

CI runs a modest, derandomized number of examples; ``MEMSIM_CACHE_ORDER_EXAMPLES=300`` searches more.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.engine.caches import parts_cache
from memsim_widget.engine.core import _estimate, estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

EXAMPLES = int(os.environ.get("MEMSIM_CACHE_ORDER_EXAMPLES", "20"))

#: Models whose layer stacks reach the engine's dense and MoE branches at a cheap size.
MODELS = ("mixtral-8x7b", "llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b", "qwen3-0.6b")


def _clear_all() -> None:
    """Every cache the engine keeps across scenarios (as benchmarks/tests of a cold engine do)."""
    _estimate.cache_clear()
    parts_cache.cache_clear()


@st.composite
def scenarios(draw: st.DrawFn, model: str | None = None) -> dict[str, Any]:
    """A scenario dict over the keys the caches split on: pipeline layout and schedule, expert/tensor/data
    parallel, ZeRO, method, checkpointing, compile, fp8, offloading, the optimizer."""
    model = model or draw(st.sampled_from(MODELS))
    pp = draw(st.sampled_from([1, 2, 4]))
    schedule = draw(st.sampled_from(["1f1b", "interleaved", "gpipe"])) if pp > 1 else "1f1b"
    v = draw(st.sampled_from([2, 4])) if schedule == "interleaved" else 1
    moe = model in ("mixtral-8x7b", "qwen3-30b-a3b")
    par: dict[str, Any] = {
        "pp": pp,
        "tp": draw(st.sampled_from([1, 2])),
        "dp": draw(st.sampled_from([1, 2, 4])),
        "ep": draw(st.sampled_from([1, 2])) if moe else 1,
        "pp_schedule": schedule,
        "virtual_stages": v,
        "pp_microbatches": draw(st.sampled_from([pp, 2 * pp])) if pp > 1 else 1,
    }
    par["zero"] = draw(st.sampled_from([0, 1, 2, 3])) if par["dp"] > 1 else 0
    if pp > 1 and draw(st.booleans()):
        par["pp_split"] = draw(st.sampled_from(["even", "torchtitan", "megatron"]))
    if pp > 1 and "pp_split" not in par and draw(st.integers(0, 3)) == 0:
        layers = {"mixtral-8x7b": 32, "llama-3.2-1b": 16, "llama-3.1-8b": 32, "qwen3-30b-a3b": 48}.get(
            model, 28
        )
        chunks = pp * v
        first = layers // chunks + draw(st.sampled_from([-1, 1]))
        rest = layers - first
        if rest % (chunks - 1) == 0 and first > 0:
            par["pp_layers"] = [first] + [rest // (chunks - 1)] * (chunks - 1)
    out: dict[str, Any] = {
        "model": model,
        "seq_len": draw(st.sampled_from([256, 1024])),
        "micro_batch_size": draw(st.sampled_from([1, 2])),
        "method": draw(st.sampled_from(["full", "full", "lora"])),
        "framework": draw(st.sampled_from(["hf", "torchtitan", "megatron", "deepspeed", "torchtune"])),
        "activation_checkpointing": draw(st.sampled_from(["none", "full", "selective"])),
        "compile": draw(st.booleans()),
        "activation_offloading": draw(st.booleans()),
        "optimizer_in_backward": draw(st.booleans()),
        "optimizer": draw(st.sampled_from(["adamw", "adamw", "sgd"])),
        "grad_accum_steps": draw(st.sampled_from([1, 2])) if pp == 1 else 1,
        "parallel": par,
    }
    out["precision"] = draw(st.sampled_from(["bf16", "bf16", "amp-bf16", "fp8"]))
    if draw(st.integers(0, 2)) == 0:
        out["fp8_recipe"] = draw(
            st.sampled_from(["tensorwise", "rowwise", "te-delayed", "te-current", "mxfp8"])
        )
    if out["activation_checkpointing"] == "full" and draw(st.booleans()):
        out["checkpoint_every"] = 2
    if out["activation_offloading"] and pp == 1 and draw(st.booleans()):
        out["activation_offloading_layers"] = draw(st.sampled_from([0, 1, 4]))
    return out


def _valid(d: dict[str, Any]) -> Scenario | None:
    """The scenario, or None where it breaks a rule (the property is about scenarios the engine estimates)."""
    try:
        sc = Scenario.from_dict(d)
        _clear_all()
        estimate(sc)
    except ScenarioError:
        return None
    return sc


def _figures(sc: Scenario) -> dict[str, Any]:
    """``estimate(sc).to_dict()`` made now, not served from the whole-estimate cache (the parts stay warm)."""
    _estimate.cache_clear()
    return estimate(sc).to_dict()


def _cold(sc: Scenario) -> dict[str, Any]:
    _clear_all()
    return estimate(sc).to_dict()


@st.composite
def neighbours(draw: st.DrawFn, a: dict[str, Any]) -> dict[str, Any]:
    """``a`` with one to three keys (top-level or ``parallel``) taken from another scenario: a neighbour
    shares most of ``a``'s cache keys, which is where a key missing a field serves the wrong part."""
    other = draw(scenarios(a["model"]))
    out = {**a, "parallel": dict(a["parallel"])}
    top = sorted({*other, *a} - {"parallel"})
    par = [f"parallel.{k}" for k in sorted({*other["parallel"], *a["parallel"]})]
    key = st.one_of(st.sampled_from(top), st.sampled_from(par))  # the layout keys as often as all others
    for k in draw(st.lists(key, min_size=1, max_size=3, unique=True)):
        src, dst, name = (
            (other["parallel"], out["parallel"], k[9:]) if k.startswith("parallel.") else (other, out, k)
        )
        if name in src:
            dst[name] = src[name]
        else:
            dst.pop(name, None)
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 20,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip
@given(data=st.data())
def test_an_estimate_after_other_scenarios_equals_it_cold(data):
    """Estimate A cold, then a random sequence of other scenarios with warm caches (each equal to its cold
    estimate), then A again: the same figures."""
    first = data.draw(scenarios())
    a = _valid(first)
    if a is None:
        return
    # most others are neighbours of A (sharing its parts' keys but for a field or two), some anything
    others = data.draw(
        st.lists(st.one_of(neighbours(first), neighbours(first), scenarios()), min_size=1, max_size=6)
    )
    seq = [s for s in map(_valid, others) if s is not None]
    cold = {s: _cold(s) for s in [a, *seq]}
    _clear_all()
    assert _figures(a) == cold[a]
    for s in seq:
        assert _figures(s) == cold[s], s
    assert _figures(a) == cold[a], a
