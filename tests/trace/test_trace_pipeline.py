"""One pipeline rank traced with torch.distributed.pipelining on fake tensors (memsim_widget.trace.pipeline)."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.distributed as dist  # noqa: E402
from fidelity_cases import LLAMA  # noqa: E402
from fidelity_parallel_cases import CASES, compare  # noqa: E402

from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402
from memsim_widget.trace import pipeline  # noqa: E402
from memsim_widget.trace.pipeline import trace_pipeline  # noqa: E402

#: Every test here runs a real trace on fake tensors: behind the slow marker (scripts/dev test runs it).
pytestmark = pytest.mark.slow

# The small Llama's parameter counts, from its config (h=256, I=688, 8 heads, 4 kv heads, V=1000).
H, I, HEADS, KV, V = 256, 688, 8, 4, 1000
D = H // HEADS
LAYER = H * HEADS * D + 2 * H * KV * D + HEADS * D * H + 3 * H * I + 2 * H  # attention, SwiGLU MLP, two norms
EMBED = V * H
HEAD = V * H
FINAL_NORM = H
BF16 = 2


def scenario(pp: int, schedule: str = "1f1b", microbatches: int | None = None, **keys: object) -> Scenario:
    """The small Llama, b1 s64 bf16 unless overridden, over ``pp`` pipeline stages."""
    par = {"pp": pp, "pp_schedule": schedule, "pp_microbatches": microbatches or pp}
    if schedule == "interleaved":
        par["virtual_stages"] = 2
    data = {"model": LLAMA, "micro_batch_size": 1, "seq_len": 64, "parallel": par, **keys}
    return Scenario.from_dict(data)


@functools.cache
def traced(pp: int, schedule: str, rank: int, microbatches: int | None = None, seq_len: int = 64):
    """A cached trace of one rank (the traces are a few seconds each)."""
    return trace_pipeline(scenario(pp, schedule, microbatches, seq_len=seq_len), rank=rank)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp", [2, 4])
def test_first_stage_holds_embeddings_and_its_layers(pp: int, schedule: str) -> None:
    r = traced(pp, schedule, 0)
    layers = 4 // pp
    assert r.model_state_bytes["parameter"] == (EMBED + layers * LAYER) * BF16
    assert r.parameters == EMBED + layers * LAYER


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp", [2, 4])
def test_last_stage_holds_its_layers_final_norm_and_head(pp: int, schedule: str) -> None:
    r = traced(pp, schedule, pp - 1)
    layers = 4 // pp
    assert r.model_state_bytes["parameter"] == (layers * LAYER + FINAL_NORM + HEAD) * BF16
    assert r.model_state_bytes["gradient"] == r.model_state_bytes["parameter"]


def test_middle_stage_holds_only_layers() -> None:
    assert traced(4, "1f1b", 1).model_state_bytes["parameter"] == LAYER * BF16


def test_gpipe_holds_more_activations_than_1f1b_on_the_first_stage() -> None:
    # pp=2, 4 micro-batches: GPipe keeps all 4 micro-batches' activations until backward, 1F1B at most 2.
    gpipe = traced(2, "gpipe", 0, 4, 256).by_role["activation"]
    one_f_one_b = traced(2, "1f1b", 0, 4, 256).by_role["activation"]
    assert gpipe > one_f_one_b


def test_interleaved_rank_runs_two_stages() -> None:
    r = traced(2, "interleaved", 0)
    assert r.layout["stages"] == [0, 2]
    assert r.layout["layers"] == [[0], [2]]
    assert r.model_state_bytes["parameter"] == (EMBED + 2 * LAYER) * BF16
    assert r.rank_role.startswith("pipeline rank 0 of 2")


def test_role_names_the_stage_modules_and_schedule() -> None:
    r = traced(4, "1f1b", 3)
    assert r.rank_role == ("pipeline stage 3 of 4: layer 3, final norm, head and loss; 1F1B, 4 micro-batches")
    assert (r.rank, r.world_size) == (3, 4)


def test_forward_and_backward_of_micro_batches_interleave_on_the_last_stage() -> None:
    # 1F1B on the last stage: each micro-batch's forward, loss and backward run back to back.
    r = traced(2, "1f1b", 1)
    phases = [m["phase"] for m in r.marks if m["step"] == 2]
    assert phases == ["forward"] + ["forward", "loss", "backward"] * 2 + [
        "optimizer_step",
        "zero_grad",
        "end",
    ]


def test_default_rank_is_the_stage_the_engine_predicts_highest() -> None:
    from memsim_widget.engine.core import estimate

    sc = scenario(2)
    ranks = estimate(sc).ranks
    expected = max(range(2), key=lambda i: ranks[i].peak_tensor_bytes)
    assert pipeline.default_rank(sc) == expected


@pytest.mark.parametrize("rank", [-1, 2, True])
def test_rank_out_of_range_names_the_field(rank: object) -> None:
    with pytest.raises(ScenarioError) as err:
        trace_pipeline(scenario(2), rank=rank)  # type: ignore[arg-type]
    assert err.value.field == "rank"


def test_1f1b_with_fewer_micro_batches_than_stages_is_refused() -> None:
    with pytest.raises(ScenarioError) as err:
        trace_pipeline(scenario(4, microbatches=2), rank=0)
    assert err.value.field == "parallel.pp_microbatches"


def test_interleaved_runs_fewer_micro_batches_than_stages_as_one_round() -> None:
    # ScheduleInterleaved1F1B: max(1, m // pp) rounds of m / rounds micro-batches (1 of 1 here); the engine
    # estimates the same layout within the pipeline rows' error (docs/fidelity-parallel.md, the m1 rows)
    r = traced(2, "interleaved", 1, microbatches=1)
    assert r.peak_bytes > 0
    assert "interleaved 1F1B, 1 micro-batches" in r.rank_role


def test_no_process_group_is_left_behind_when_the_trace_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(pipeline, "_batch", broken)
    with pytest.raises(RuntimeError, match="boom"):
        trace_pipeline(scenario(2), rank=0)
    assert not dist.is_initialized()


def test_lora_stage_trains_only_the_adapters_of_its_layers() -> None:
    sc = scenario(2, method="lora", lora={"rank": 8, "targets": ["q_proj", "v_proj"]})
    r = trace_pipeline(sc, rank=1)
    per_layer = (H + HEADS * D) * 8 + (H + KV * D) * 8  # A (r x in) + B (out x r) on q_proj and v_proj
    assert r.trainable_parameters == 2 * per_layer
    assert r.model_state_bytes["gradient"] == 2 * per_layer * 4  # peft keeps adapters in fp32
    assert r.model_state_bytes["parameter"] == (2 * LAYER + FINAL_NORM + HEAD) * BF16 + 2 * per_layer * 4


def test_amp_stage_keeps_fp32_weights() -> None:
    r = trace_pipeline(scenario(2, precision="amp-bf16"), rank=0)
    assert r.model_state_bytes["parameter"] == (EMBED + 2 * LAYER) * 4


def test_full_checkpointing_keeps_fewer_activations_on_the_first_stage() -> None:
    ckpt = trace_pipeline(scenario(2, seq_len=256, activation_checkpointing="full"), rank=0)
    assert ckpt.by_role["activation"] < traced(2, "1f1b", 0, None, 256).by_role["activation"]


def test_pp_x_dp_fsdp_rank_holds_half_of_its_stage() -> None:
    # pp=2 x dp=2, zero 3: global rank 3 is stage 1 (pp outermost), dp rank 1; every dim 0 here is even.
    par = {"pp": 2, "dp": 2, "zero": 3, "pp_microbatches": 2}
    sc = Scenario.from_dict({"model": LLAMA, "micro_batch_size": 1, "seq_len": 64, "parallel": par})
    r = trace_pipeline(sc, rank=3)
    assert r.layout["stages"] == [1]
    assert r.model_state_bytes["parameter"] == (2 * LAYER + FINAL_NORM + HEAD) * BF16 // 2
    assert r.rank_role.startswith("rank 3 of 4: pipeline stage 1 of 2")
    assert not dist.is_initialized()


def test_pp_x_dp_fsdp_passes_reshard_after_forward_to_fully_shard() -> None:
    # parallel.reshard_after_forward reaches FSDP2 on every stage module (fully_shard's own argument, named
    # in the layout note), so a pipeline without reshard after forward is traced as configured
    for keep in (True, False):
        par = {"pp": 2, "dp": 2, "zero": 3, "pp_microbatches": 2, "reshard_after_forward": keep}
        sc = Scenario.from_dict({"model": LLAMA, "micro_batch_size": 1, "seq_len": 64, "parallel": par})
        notes = trace_pipeline(sc, rank=0).notes
        assert any(f"reshard_after_forward={keep}" in n for n in notes), notes


def test_pp_x_tp_is_refused() -> None:
    par = {"pp": 2, "tp": 2, "pp_microbatches": 2}
    sc = Scenario.from_dict({"model": LLAMA, "micro_batch_size": 1, "seq_len": 64, "parallel": par})
    with pytest.raises(ScenarioError) as err:
        trace_pipeline(sc, rank=0)
    assert err.value.field == "parallel"


def test_output_lifetime_step_keeps_every_micro_batch_logits_through_the_optimizer_step() -> None:
    # return_outputs=True: the last stage keeps each micro-batch's bf16 logits (b x s x V) until the next step,
    # and the loop keeps what step returned, their concatenation (a copy of each).
    def live_at_optimizer_step(r: object) -> int:
        return next(m["live"] for m in r.marks if m["step"] == 2 and m["phase"] == "optimizer_step")

    kept = trace_pipeline(scenario(2, output_lifetime="step"), rank=1)
    dropped = traced(2, "1f1b", 1)
    assert live_at_optimizer_step(kept) - live_at_optimizer_step(dropped) == 2 * 2 * 1 * 64 * V * BF16


def test_an_uneven_split_gives_each_stage_its_listed_layers() -> None:
    sc = Scenario.from_dict(
        {"model": LLAMA, "parallel": {"pp": 2, "pp_microbatches": 2, "pp_layers": [1, 3]}}
    )
    assert [p.layers for r in (0, 1) for p in pipeline.stage_plans(sc, r, 4)] == [range(0, 1), range(1, 4)]
    inter = {"pp": 2, "pp_microbatches": 2, "pp_schedule": "interleaved", "virtual_stages": 2}
    # three layers per rank over two chunks: the first rank's shortfall on its first chunk (the embedding's),
    # the last rank's on its last (the head's); chunks run in looped order (stage s on rank s % pp)
    sc = Scenario.from_dict({"model": LLAMA, "parallel": {**inter, "pp_layers": [3, 3]}})
    assert [p.layers for p in pipeline.stage_plans(sc, 0, 6)] == [range(0, 1), range(3, 5)]
    assert [p.layers for p in pipeline.stage_plans(sc, 1, 6)] == [range(1, 3), range(5, 6)]


def test_a_first_or_last_stage_may_hold_only_its_embedding_or_head() -> None:
    par = {"pp": 3, "pp_microbatches": 3, "pp_layers": [0, 4, 0]}
    sc = Scenario.from_dict({"model": LLAMA, "micro_batch_size": 1, "seq_len": 64, "parallel": par})
    assert [p.layers for r in (0, 1, 2) for p in pipeline.stage_plans(sc, r, 4)] == [
        range(0, 0), range(0, 4), range(4, 4)
    ]  # fmt: skip
    first, last = trace_pipeline(sc, rank=0), trace_pipeline(sc, rank=2)
    assert first.rank_role.startswith("pipeline stage 0 of 3: embeddings;")
    assert last.rank_role.startswith("pipeline stage 2 of 3: final norm, head and loss;")
    # bf16 weights: the embedding alone, then the final norm and head alone
    assert first.model_state_bytes["parameter"] == EMBED * BF16
    assert first.parameters == EMBED
    assert last.model_state_bytes["parameter"] == (FINAL_NORM + HEAD) * BF16
    assert last.model_state_bytes["gradient"] == last.model_state_bytes["parameter"]


@pytest.mark.parametrize(
    "name",
    [
        "V32k mistral bf16 pp2 1f1b m4 [0, 4] stage 0 (embedding only)",
        "V32k mistral bf16 pp3 1f1b m4 [2, 2, 0] stage 2 (head and loss only)",
    ],
)
def test_a_stage_of_no_layer_is_predicted_within_one_percent_never_half_a_percent_under(name: str) -> None:
    data, stage = {n: (d, s) for n, d, s in CASES}[name]
    err = compare(name, data, stage)["error"]
    assert -0.005 <= err < 0.01, err


def test_without_a_list_an_indivisible_split_is_torchtitans() -> None:
    # 6 layers + embedding + head = 8 over 4 chunks is 2 each, one fewer on the first and the last: 1, 2, 2, 1
    inter = {"pp": 2, "pp_microbatches": 2, "pp_schedule": "interleaved", "virtual_stages": 2}
    sc = Scenario.from_dict({"model": LLAMA, "parallel": inter})
    assert [p.layers for r in (0, 1) for p in pipeline.stage_plans(sc, r, 6)] == [
        range(0, 1), range(3, 5), range(1, 3), range(5, 6)
    ]  # fmt: skip
