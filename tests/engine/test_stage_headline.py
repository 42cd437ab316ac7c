"""The headline of a multi-stage (pp > 1) scenario: per counter the worst stage, named; the verdict on the
stage with the largest nvidia-smi total (hypothesis over random pipeline scenarios)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memsim_widget.cli import _table
from memsim_widget.engine.core import estimate
from memsim_widget.engine.estimate import COUNTERS
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.widget.result import build_result

PIPELINES = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["llama-3.2-1b", "qwen2.5-0.5b", "llama-3.1-8b", "mistral-7b"]),
        "precision": st.sampled_from(["bf16", "mixed-bf16", "amp-bf16"]),
        "activation_checkpointing": st.sampled_from(["none", "selective", "full"]),
        "micro_batch_size": st.sampled_from([1, 2, 4]),
        "seq_len": st.sampled_from([512, 2048, 4096]),
        "parallel": st.fixed_dictionaries(
            {
                "pp": st.sampled_from([2, 4]),
                "pp_schedule": st.sampled_from(["1f1b", "gpipe", "interleaved"]),
                "pp_microbatches": st.sampled_from([1, 2, 4, 8]),
                "dp": st.sampled_from([1, 2]),
                "tp": st.sampled_from([1, 2]),
            }
        ),
    }
)

#: A layout whose largest nvidia-smi stage is not the one that allocates the most: under interleaved 1F1B
#: stage 0 (the embedding, the most micro-batches in flight) allocates the most, while stage 2's allocator
#: pool (engine/counters/overhead) makes its reserved and nvidia-smi figures the largest.
SPLIT = {
    "model": "mistral-7b",
    "precision": "mixed-bf16",
    "micro_batch_size": 4,
    "seq_len": 512,
    "parallel": {"pp": 4, "pp_schedule": "interleaved", "pp_microbatches": 4, "virtual_stages": 2},
}


def _pipeline(d: dict) -> dict:
    if d["parallel"]["pp_schedule"] == "interleaved":
        d["parallel"]["virtual_stages"] = 2
    return d


@settings(max_examples=40, deadline=None)
@given(PIPELINES)
def test_each_headline_counter_is_its_worst_stage_and_names_it(d):
    try:
        est = estimate(Scenario.from_dict(_pipeline(d)))
    except ScenarioError:
        assume(False)
    out = est.to_dict()
    by_label = {r["rank"]: r for r in out["per_rank"]}
    assert len(by_label) == d["parallel"]["pp"]  # per_rank shows each stage
    for counter in COUNTERS:
        figures = [r[counter] for r in out["per_rank"]]
        assert out[counter] == max(figures)
        named = out["peak_ranks"][counter]
        assert by_label[named][counter] == out[counter]
        # the first of equals, as max() picks
        assert named == out["per_rank"][figures.index(max(figures))]["rank"]
    # the verdict stays on the stage with the largest nvidia-smi total
    assert out["peak_rank"] == out["peak_ranks"]["device_total_bytes"]
    assert out["fits"] == (
        max(r["device_total_bytes"] for r in out["per_rank"]) <= est.gpu.memory_bytes * 0.9
    )
    # every headline counter is at least its figure on the verdict's rank
    worst = by_label[out["peak_rank"]]
    assert all(out[c] >= worst[c] for c in COUNTERS)


def test_a_stage_that_allocates_more_than_the_verdicts_stage_is_the_allocated_headline():
    est = estimate(Scenario.from_dict(SPLIT))
    s0, s2 = est.ranks[0], est.ranks[2]
    assert max(est.ranks, key=lambda r: r.device_total_bytes) is s2
    assert max(est.ranks, key=lambda r: r.peak_allocated_bytes) is s0
    assert est.worst is s2 and est.peak_phase == s2.peak_phase
    assert est.peak_allocated_bytes == s0.peak_allocated_bytes > s2.peak_allocated_bytes
    assert est.peak_tensor_bytes == s0.peak_tensor_bytes
    assert est.device_total_bytes == s2.device_total_bytes
    assert est.uncertainty()["peak_allocated_bytes"] == s0.uncertainty()["peak_allocated_bytes"]
    assert est.uncertainty()["device_total_bytes"] == s2.uncertainty()["device_total_bytes"]


def test_the_cli_text_and_the_widget_name_each_figures_stage():
    est = estimate(Scenario.from_dict(SPLIT))
    text = _table(est, 0.1)
    assert "(torch.cuda.max_memory_allocated) on stage 0" in text
    assert "(nvidia-smi) on stage 2" in text
    peaks = {p["key"]: p for p in build_result(est, 0.1)["peaks"]}
    assert peaks["peak_allocated_bytes"]["rank"] == "stage 0"
    assert peaks["peak_allocated_bytes"]["bytes"] == est.ranks[0].peak_allocated_bytes
    assert peaks["device_total_bytes"]["rank"] == "stage 2"


def test_one_stage_names_no_stage_in_the_text():
    est = estimate(Scenario.from_dict({"model": "llama-3.2-1b"}))
    counters = [line for line in _table(est, 0.1).splitlines() if line.startswith("  ") and "GiB  (" in line]
    assert len(counters) == 4 and not any(" on " in line for line in counters)
