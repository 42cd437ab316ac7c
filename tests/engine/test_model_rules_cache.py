"""The ``model`` stage rule check remembered per scenario (``engine/caches/model_rules_cache``): keyed by every field the
rules read, and by no other; a scenario that breaks a rule raises every time."""

from __future__ import annotations

import dataclasses

import pytest

from memsim_widget.engine.caches import model_rules_cache
from memsim_widget.engine.context import Context
from memsim_widget.errors import ScenarioError
from memsim_widget.rules import ScenarioView
from memsim_widget.scenario import ParallelConfig, Scenario

#: Scenarios reaching the model and multimodal rules: layouts, LoRA targets, an MoE, a multimodal model, a
#: learned position table, a state-space model, and some that break a rule.
SCENARIOS = [
    {"model": "llama-3.2-1b", "seq_len": 1024},
    {"model": "llama-3.2-1b", "parallel": {"tp": 2, "pp": 2, "pp_microbatches": 4, "cp": 2}},
    {"model": "llama-3.2-1b", "method": "lora", "lora": {"targets": ["q_proj", "v_proj"]}},
    {"model": "mixtral-8x7b", "seq_len": 256, "parallel": {"dp": 2, "ep": 2, "zero": 1}},
    {"model": "llava-1.5-7b", "seq_len": 256, "method": "lora", "images_per_sample": 2},
    {"model": "mamba-130m", "seq_len": 256},
    {"model": "gpt2", "seq_len": 2048},
    {"model": "qwen2.5-0.5b", "parallel": {"tp": 4}},
    {"model": "llama-3.2-1b", "method": "lora", "lora": {"targets": ["c_attn"]}},
]


def _outcome(data: dict, during: list[bool] | None = None) -> str:
    """The model-stage check of ``data`` uncached: "ok" or the error it raises (``during`` set to [True] while
    the check runs, after the scenario's own checks)."""
    model_rules_cache.cache_clear()
    sc = Scenario.from_dict(data)
    if during is not None:
        during[:] = [True]
    try:
        Context(sc)
    except ScenarioError as exc:
        return f"{exc.field}: {exc}"
    finally:
        if during is not None:
            during[:] = [False]
    return "ok"


def test_the_key_covers_every_scenario_field_but_the_ignored_ones():
    names = [f.name for f in dataclasses.fields(Scenario)]
    par = [f.name for f in dataclasses.fields(ParallelConfig)]
    ignored, ignored_par = model_rules_cache.MODEL_RULES_IGNORE, model_rules_cache.MODEL_RULES_IGNORE_PARALLEL
    assert set(names) >= ignored and set(par) >= ignored_par
    sc = Scenario.from_dict(SCENARIOS[1])
    assert model_rules_cache.model_rules_key(sc) == (
        tuple(getattr(sc, n) for n in names if n not in ignored | {"parallel"}),
        tuple(getattr(sc.parallel, n) for n in par if n not in ignored_par),
    )


def test_the_rules_read_no_ignored_field(monkeypatch):
    read: set[str] = set()
    during = [False]
    get = ScenarioView.__getitem__

    def recording(self: ScenarioView, key: str):  # type: ignore[no-untyped-def]
        if during[0]:
            read.add(key)
        return get(self, key)

    monkeypatch.setattr(ScenarioView, "__getitem__", recording)
    outcomes = {_outcome(d, during) for d in SCENARIOS}
    assert "ok" in outcomes and len(outcomes) > 2  # some pass, several rules break
    fields = {k.split(".")[0] for k in read if not k.startswith("parallel.")}
    assert fields and not fields & model_rules_cache.MODEL_RULES_IGNORE
    parallel = {k.split(".")[1] for k in read if k.startswith("parallel.")}
    assert parallel and not parallel & model_rules_cache.MODEL_RULES_IGNORE_PARALLEL


@pytest.mark.parametrize(
    ("passing", "breaking"),
    [
        ({"model": "gpt2", "seq_len": 1024}, {"model": "gpt2", "seq_len": 2048}),
        ({"model": "llama-3.2-1b", "seq_len": 2048}, {"model": "gpt2", "seq_len": 2048}),
        ({"model": "qwen2.5-0.5b", "parallel": {"tp": 2}}, {"model": "qwen2.5-0.5b", "parallel": {"tp": 4}}),
        (
            {"model": "llama-3.2-1b", "method": "lora", "lora": {"targets": ["q_proj"]}},
            {"model": "llama-3.2-1b", "method": "lora", "lora": {"targets": ["c_attn"]}},
        ),
    ],
)
def test_a_scenario_differing_in_a_key_field_is_checked_again(passing, breaking):
    want = _outcome(breaking)
    assert _outcome(passing) == "ok" and want != "ok"
    model_rules_cache.cache_clear()
    Context(Scenario.from_dict(passing))  # remembered as passing
    with pytest.raises(ScenarioError) as exc:
        Context(Scenario.from_dict(breaking))
    assert f"{exc.value.field}: {exc.value}" == want


def test_a_broken_scenario_raises_every_time():
    model_rules_cache.cache_clear()
    for _ in range(2):
        with pytest.raises(ScenarioError, match="seq_len"):
            Context(Scenario.from_dict({"model": "gpt2", "seq_len": 2048}))
