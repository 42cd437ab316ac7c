"""Uneven pipeline splits (``parallel.pp_layers``): the largest published recipes are accepted, and each stage
holds what its own layers hold."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.context import Context, interleaved_held_layers, interleaved_loss_grad_chunks
from memsim_widget.engine.core import estimate
from memsim_widget.engine.parallel.schedule import interleaved_in_flight
from memsim_widget.engine.states import model_states
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

#: Llama 3.1 405B (126 layers) on pp 16 x 4 virtual stages: Megatron counts the embedding and the loss as
#: layers (128 / 64 chunks = 2 each), so the first and last rank hold one layer fewer.
LLAMA_405B = {
    "model": "llama-3.1-405b",
    "parallel": {
        "pp": 16, "virtual_stages": 4, "pp_schedule": "interleaved", "pp_microbatches": 32, "tp": 8,
        "pp_layers": [7] + [8] * 14 + [7],
    },
}  # fmt: skip
#: DeepSeek-V3 (61 layers) on 16 stages with fewer layers on the first and last (Megatron's
#: --decoder-first/last-pipeline-num-layers).
DEEPSEEK_V3 = {
    "model": "deepseek-v3",
    "parallel": {"pp": 16, "pp_microbatches": 16, "dp": 8, "ep": 8, "pp_layers": [3] + [4] * 14 + [2]},
}


def test_the_largest_published_pipelines_are_accepted_with_their_splits():
    for data in (LLAMA_405B, DEEPSEEK_V3):
        est = estimate(Scenario.from_dict(data))
        assert [r.stage.layers for r in est.ranks] == data["parallel"]["pp_layers"]
        assert est.to_dict()["scenario"]["parallel"]["pp_layers"] == data["parallel"]["pp_layers"]


def _without_list(data: dict) -> dict:
    return {**data, "parallel": {k: v for k, v in data["parallel"].items() if k != "pp_layers"}}


def test_without_pp_layers_the_largest_published_pipelines_get_torchtitans_split():
    # torchtitan (and Megatron's embedding/loss accounting): 126 + 2 layer-equivalents over 64 chunks is 2
    # each, the first and last chunk give one up: ranks 7, 8 x 14, 7 -- the published split, figure for figure
    listed = estimate(Scenario.from_dict(LLAMA_405B))
    auto = estimate(Scenario.from_dict(_without_list(LLAMA_405B)))
    assert [r.peak_allocated_bytes for r in auto.ranks] == [r.peak_allocated_bytes for r in listed.ranks]
    assert "pp_layers" not in auto.to_dict()["scenario"]["parallel"]
    # 61 + 2 over 16 stages: 3 each and 15 left over for stages 0-14 (4), then one fewer at both ends
    est = estimate(Scenario.from_dict(_without_list(DEEPSEEK_V3)))
    assert [r.stage.layers for r in est.ranks] == [3] + [4] * 14 + [2]


@pytest.mark.parametrize(
    ("style", "layers"),
    [
        # 32 + 2 = 34 over 4: 8 each, 2 left over for stages 0 and 1; then one fewer at both ends
        ("torchtitan", [8, 9, 8, 7]),
        ("megatron", None),  # 34 is not divisible by 4: Megatron asserts it
        ("even", [8, 8, 8, 8]),
    ],
)
def test_the_split_style_is_a_scenario_key(style, layers):
    data = {"model": "llama-3.1-8b", "parallel": {"pp": 4, "pp_microbatches": 4, "pp_split": style}}
    if layers is None:
        with pytest.raises(ScenarioError) as err:
            estimate(Scenario.from_dict(data))
        assert err.value.field == "parallel.pp" and "Megatron" in str(err.value)
        return
    est = estimate(Scenario.from_dict(data))
    assert [r.stage.layers for r in est.ranks] == layers
    assert est.to_dict()["scenario"]["parallel"]["pp_split"] == style


def test_an_indivisible_split_is_refused_only_where_asked_for_even_and_names_the_keys():
    bad = _without_list(LLAMA_405B)
    bad = {**bad, "parallel": {**bad["parallel"], "pp_split": "even"}}
    with pytest.raises(ScenarioError) as err:
        estimate(Scenario.from_dict(bad))
    assert err.value.field == "parallel.pp" and "parallel.pp_split" in str(err.value)
    # 16 layers over 16 chunks: torchtitan's 18 layer-equivalents leave the last chunk without a layer
    tiny = {"model": "llama-3.2-1b", "parallel": {"pp": 8, "virtual_stages": 2, "pp_schedule": "interleaved",
                                                 "pp_microbatches": 8, "pp_split": "torchtitan"}}  # fmt: skip
    with pytest.raises(ScenarioError) as err:
        estimate(Scenario.from_dict(tiny))
    assert err.value.field == "parallel.pp" and "without a layer" in str(err.value)


def test_a_listed_split_and_a_style_are_one_clear_error():
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict({"parallel": {"pp": 2, "pp_layers": [16, 16], "pp_split": "torchtitan"}})
    assert err.value.field == "parallel.pp_split"
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict({"parallel": {"pp": 2, "pp_split": "uneven"}})
    assert err.value.field == "parallel.pp_split"


def test_an_interleaved_rank_with_uneven_chunks_holds_them_in_the_schedules_order():
    # p = 2, m = 2, v = 2: 2 micro-batches per round, so rank 1 warms up with 2 forwards of its chunk 0
    # (2 layers each: 4), then each step runs a forward of chunk 1 (+1: 5, the peak) and a backward of chunk 1
    assert interleaved_held_layers(2, 2, 1, (2, 1)) == 5.0
    # rank 0 warms up with every forward (2 + 2 (p - 1) = 4 = m v): 1 + 1 + 2 + 2
    assert interleaved_held_layers(2, 2, 0, (1, 2)) == 6.0


def test_the_last_rank_holds_fewer_sets_while_its_loss_runs_than_at_a_forward_of_its_first_chunk():
    # p = 2, m = 4, v = 2, chunks (2, 1) on rank 1: rounds of 2; warm-up F0 F0 (4); steps F1 B1, F1 B1 (5,
    # each with a loss), F0 B0, F0 B0 (6, no loss), F1 B1, F1 B1 (5, losses), then B0 B0
    assert interleaved_held_layers(2, 4, 1, (2, 1)) == 6.0
    assert interleaved_held_layers(2, 4, 1, (2, 1), at_loss=True) == 5.0


def test_with_one_round_the_last_rank_runs_its_other_chunks_backwards_after_its_last_loss():
    # p = 2, m = 3, v = 2 (one round of 3): rank 1 runs 1F0 1F1 1F2 3F0 3B0 3F1 3B1 3F2 3B2 1B0 1B1 1B2, so
    # at its losses only its last chunk (stage 3) has gradients
    assert interleaved_loss_grad_chunks(2, 3, 2) == 1
    assert interleaved_loss_grad_chunks(4, 6, 3) == 1
    # two rounds or more: the last round's losses come after every chunk's first backward
    assert interleaved_loss_grad_chunks(2, 4, 2) == 2
    assert interleaved_loss_grad_chunks(4, 12, 3) == 3
    assert interleaved_loss_grad_chunks(2, 1, 2) == 0  # one micro-batch: no backward before the loss


@pytest.mark.parametrize(("m", "missing"), [(3, 4), (4, 0)])  # one round: chunk 1's 4 layers have none yet
def test_gradients_at_the_loss_of_an_interleaved_last_rank_are_its_loss_chunks(m, missing):
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {
        "pp": 2, "virtual_stages": 2, "pp_schedule": "interleaved", "pp_microbatches": m}})  # fmt: skip
    ctx = Context(sc)
    last = ctx.stages[-1]  # 16 layers: chunks of 4, the last rank holds stages 1 and 3
    assert ctx.loss_grad_layers(last) == last.layers - missing
    st = model_states(ctx, last)
    gone = sum(i.bytes for i in st.grads) - sum(i.bytes for i in st.loss_grads)
    assert gone == int(st.grad_bytes_per_layer * missing)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 8), st.integers(2, 4), st.integers(1, 4), st.integers(1, 5), st.data())
def test_equal_chunks_hold_the_in_flight_formula(p, v, rounds, size, data):
    m = p * rounds
    rank = data.draw(st.integers(0, p - 1))
    assert interleaved_held_layers(p, m, rank, (size,) * v) == pytest.approx(
        size * v * interleaved_in_flight(p, v, m, rank)
    )


@pytest.mark.parametrize(
    ("par", "field"),
    [
        ({"pp": 2, "pp_layers": [7, 8]}, "parallel.pp_layers"),  # 15 of 16 layers
        ({"pp": 2, "pp_layers": [16]}, "parallel.pp_layers"),  # one count for two stages
        ({"pp_layers": [16]}, "parallel.pp_layers"),  # no pipeline
        ({"pp": 2, "pp_layers": [-1, 17]}, "parallel.pp_layers[0]"),  # (0 on an end stage is allowed)
        ({"pp": 3, "pp_layers": [8, 0, 8]}, "parallel.pp_layers"),  # a middle stage of nothing
        ({"pp": 2, "pp_layers": "8,8"}, "parallel.pp_layers"),
        (
            {"pp": 2, "virtual_stages": 2, "pp_schedule": "interleaved", "pp_layers": [1, 15]},
            "parallel.pp_layers",
        ),
    ],
)
def test_bad_splits_are_one_clear_error(par, field):
    with pytest.raises(ScenarioError) as err:
        estimate(Scenario.from_dict({"model": "llama-3.2-1b", "parallel": par}))
    assert err.value.field == field


def test_an_even_list_is_the_even_split():
    even = estimate(Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {"pp": 4}}))
    listed = estimate(
        Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {"pp": 4, "pp_layers": [4] * 4}})
    )
    assert [r.device_total_bytes for r in listed.ranks] == [r.device_total_bytes for r in even.ranks]
    assert "pp_layers" not in even.to_dict()["scenario"]["parallel"]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=2, max_size=2).filter(lambda s: sum(s) < 16))
def test_each_stage_holds_its_own_layers_weights(middle):
    # llama-3.2-1b: 16 layers; four stages, the two middle ones drawn, the ends take the rest
    rest = 16 - sum(middle)
    split = [rest // 2 or 1, *middle, rest - (rest // 2 or 1)]
    if split[-1] < 1:
        return
    ctx = Context(Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {"pp": 4, "pp_layers": split}}))
    layer = sum(g.numel for g in ctx.arch.params if g.scope == "layer") // ctx.arch.num_layers
    weights = [
        sum(i.bytes for i in model_states(ctx, s).persistent if i.category == "parameters")
        for s in ctx.stages
    ]
    # middle stages hold only layers (bf16 weights: 2 B each)
    assert weights[1] == middle[0] * layer * 2 and weights[2] == middle[1] * layer * 2


def test_the_role_names_each_stages_own_layers():
    est = estimate(
        Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {"pp": 3, "pp_layers": [4, 7, 5]}})
    )
    roles = [est.role(r) for r in est.ranks]
    assert "layers 0-3" in roles[0] and "layers 4-10" in roles[1] and "layers 11-15" in roles[2]


#: Llama 3.1 8B (untied): its embedding, 128,256 x 4,096 parameters, is all a stage of no layer holds first.
EMBED_8B = 128256 * 4096


def _eight_b(pp_layers: list[int], **par: object) -> Scenario:
    return Scenario.from_dict(
        {
            "model": "llama-3.1-8b",
            "parallel": {"pp": len(pp_layers), "pp_microbatches": 4, "pp_layers": pp_layers, **par},
        }
    )


def _backward_end(sc: Scenario, stage: int) -> dict[str, int]:
    rank = estimate(sc).ranks[stage]
    return {i.item: i.bytes for i in {m.name: m for m in rank.moments}["backward_end"].items}


@pytest.mark.parametrize("pp_layers", [[0, 32], [32, 0], [0, 32, 0], [0, 16, 16], [16, 16, 0]])
def test_the_first_and_last_stage_may_hold_only_the_embedding_or_the_head(pp_layers):
    # torchtitan's module_fqns_per_model_part and Megatron's "E|t*32|L" layouts build such stages
    est = estimate(_eight_b(pp_layers))
    assert [r.stage.layers for r in est.ranks] == pp_layers
    roles = [est.role(r) for r in est.ranks]
    if pp_layers[0] == 0:
        assert roles[0] == f"pipeline stage 0 of {len(pp_layers)} (no layers, embeddings)"
    if pp_layers[-1] == 0:
        assert roles[-1].endswith("(no layers, head and loss)")


@pytest.mark.parametrize(
    ("pp_layers", "par", "words"),
    [
        ([16, 0, 16], {}, "needs a layer on every middle stage"),
        ([0, 32], {"pp_schedule": "interleaved", "virtual_stages": 2}, "at least virtual_stages = 2"),
        ([1, 31], {"pp_schedule": "interleaved", "virtual_stages": 2}, "at least virtual_stages = 2"),
        ([0, 31], {}, "must add up to the model's 32 layers"),
    ],
)
def test_a_middle_stage_or_a_chunk_of_no_layer_is_refused(pp_layers, par, words):
    with pytest.raises(ScenarioError, match="parallel.pp_layers") as err:
        estimate(_eight_b(pp_layers, **par))
    assert words in str(err.value)


def test_a_stage_of_only_the_embedding_holds_its_weights_states_and_gradients():
    rank = estimate(_eight_b([0, 32])).ranks[0]
    # bf16 weights and gradients, AdamW's two bf16 moments: 2 + 2 + 2 x 2 bytes per embedding parameter
    end = _backward_end(_eight_b([0, 32]), 0)
    assert end["embedding weights"] == EMBED_8B * 2
    assert end["adamw states"] == EMBED_8B * 2 * 2
    assert end["gradients"] == EMBED_8B * 2
    assert rank.stage.layers == 0


def test_a_stage_of_no_layer_runs_no_layer_backward_but_a_second_embedding_gradient():
    # the bottom of its backward is embedding_dense_backward: with 4 micro-batches the earlier ones' gradient
    # is alive when the next one's is made (AccumulateGrad then adds it in place; traced in
    # tests/trace/test_trace_pipeline.py); no layer's activations or backward temporaries
    end = _backward_end(_eight_b([0, 32]), 0)
    assert end["the embeddings' new gradient, before it is added to the accumulated one"] == EMBED_8B * 2
    assert not [k for k in end if "layer" in k]
    # one micro-batch: its gradient becomes .grad, nothing is added
    one = _backward_end(_eight_b([0, 32], pp_microbatches=1), 0)
    assert not [k for k in one if "new gradient" in k]
    assert one["gradients"] == EMBED_8B * 2


def test_a_stage_of_only_the_head_holds_the_final_norm_and_head():
    end = _backward_end(_eight_b([32, 0]), 1)
    assert not [k for k in end if "new gradient" in k or "layer" in k]
    assert end["gradients"] == (EMBED_8B + 4096) * 2  # the head (as large as the embedding) and final norm
    assert estimate(_eight_b([32, 0])).ranks[1].stage.layers == 0


def test_the_pipeline_layouts_traces_show_under_carry_a_caveat():
    # pipelines over FSDP in layouts not traced carry a caveat (docs/fidelity-parallel.md);
    # GPipe's last stage is modelled since (its second micro-batch's backward: the fidelity suite's GPipe [2, 2] and [3, 1] cases)
    from memsim_widget.engine.caveats import pipeline_under_caveat

    def said(parallel: dict) -> str:
        return pipeline_under_caveat(Scenario.from_dict({"model": "llama-3.1-8b", "parallel": parallel}))

    assert said({"pp": 2, "pp_schedule": "gpipe"}) == ""
    # over FSDP2, the layouts the suite traces (its pp2 x dp2 fsdp rows) carry none: 1F1B with and without
    # reshard_after_forward, GPipe and interleaved over 2 virtual stages with it
    fsdp = {"pp": 2, "dp": 2, "zero": 3, "pp_microbatches": 4}
    inter = {"pp_schedule": "interleaved", "virtual_stages": 2}
    assert said(fsdp) == said({**fsdp, "reshard_after_forward": False}) == ""
    assert said({**fsdp, "pp_schedule": "gpipe"}) == said({**fsdp, **inter}) == ""
    # untraced: the other schedules without reshard_after_forward, interleaved over more chunks
    assert "without reshard_after_forward" in said(
        {**fsdp, "pp_schedule": "gpipe", "reshard_after_forward": False}
    )
    assert "without reshard_after_forward" in said({**fsdp, **inter, "reshard_after_forward": False})
    assert "over 3 virtual stages" in said(
        {**fsdp, "pp_schedule": "interleaved", "virtual_stages": 3, "pp_microbatches": 2}
    )
    assert said({"pp": 2}) == said({"dp": 2, "zero": 3}) == ""


def test_a_pipeline_over_fsdp2_accumulates_unsharded_gradients_and_steps_the_shards():
    # torch 2.13 pipelining/stage.py: no reduce-scatter until the schedule's end, so every backward moment of a
    # stage meets the whole stage's unsharded gradients (numel x 2 B in bf16), and the optimizer the dp shards
    from memsim_widget.engine.core import estimate

    sc = Scenario.from_dict(
        {"model": "llama-3.1-8b", "precision": "bf16", "seq_len": 1024,
         "parallel": {"pp": 2, "dp": 2, "zero": 3, "pp_microbatches": 4}}
    )  # fmt: skip
    for rank in estimate(sc).ranks:
        by = {m.name: m for m in rank.moments}
        acc = [i.bytes for i in by["backward_end"].items if "accumulated" in i.item]
        shards = [i.bytes for i in by["optimizer_step"].items if i.category == "gradients"]
        assert len(acc) == len(shards) == 1 and acc[0] == 2 * shards[0]  # dp 2: the unsharded is 2 shards


def _fsdp_pipeline_moments(**parallel: object) -> list[dict[str, object]]:
    """Each rank's moments by name for llama-3.1-8b in bf16 over pp 2 x dp 2 (FSDP2), 1,024 tokens."""
    from memsim_widget.engine.core import estimate

    par = {"pp": 2, "dp": 2, "zero": 3, "pp_microbatches": 4, **parallel}
    sc = Scenario.from_dict({"model": "llama-3.1-8b", "precision": "bf16", "seq_len": 1024, "parallel": par})
    return [{m.name: m for m in rank.moments} for rank in estimate(sc).ranks]


#: llama-3.1-8b: a layer's parameters (q, o 4096 x 4096; k, v 1024 x 4096; gate, up, down 14336 x 4096; two
#: norms) and its largest one (an MLP projection), in bf16.
LLAMA8B_LAYER_BYTES = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096 + 2 * 4096) * 2
LLAMA8B_LARGEST_LAYER_PARAM_BYTES = 14336 * 4096 * 2


def test_gpipe_over_fsdp2_meets_a_new_gradient_or_the_loss_backward_not_both():
    # GPipe's second backward: AccumulateGrad makes a layer's new gradient apart from the accumulated one
    # (the largest layer parameter's, not the embedding's or head's), and the last stage's loss backward
    # comes before it: the larger of the two (traced: docs/fidelity-parallel.md, the gpipe fsdp rows)
    first, last = _fsdp_pipeline_moments(pp_schedule="gpipe")
    new = [i.bytes for i in first["backward_next"].items if "new gradient" in i.item]
    assert new == [LLAMA8B_LARGEST_LAYER_PARAM_BYTES]
    items = last["backward_next"].items
    assert any(i.item.startswith("loss backward") for i in items)  # two fp32 T x V buffers > 117 MB
    assert not any("new gradient" in i.item for i in items)


def test_an_interleaved_rank_over_fsdp2_regathers_a_chunk_beside_its_other_chunks():
    # v 2: 4 chunks of 8 layers, 16 a rank; while one chunk's layer is gathered the other chunk's 8 are still
    # gathered from their backward (torch 2.13 ScheduleInterleaved1F1B, traced: the interleaved fsdp rows)
    for by in _fsdp_pipeline_moments(pp_schedule="interleaved", virtual_stages=2):
        kept = {
            i.item: i.bytes for i in by["chunk_regather"].items if "FSDP2" in i.item and "chunk" in i.item
        }
        assert sorted(kept.values()) == [LLAMA8B_LAYER_BYTES, 8 * LLAMA8B_LAYER_BYTES]
    # one chunk a rank: nothing kept from another chunk, and the moment never above the top of backward
    for by in _fsdp_pipeline_moments():
        assert not any("other chunks" in i.item for i in by["chunk_regather"].items)
        assert by["chunk_regather"].tensor_bytes <= by["backward_top"].tensor_bytes


def test_a_plain_pipeline_stage_makes_each_new_gradient_beside_the_carried_ones():
    # a middle stage of 1F1B (pp 3, 4 micro-batches, no data parallelism): from the second micro-batch on,
    # AccumulateGrad makes the top layer's new gradient apart from the .grad the first left (the largest layer
    # parameter, an MLP projection, in bf16) -- traced: the fidelity suite's [2, 2, 2] middle-stage row
    from memsim_widget.engine.core import estimate

    def new_grads(schedule: str, dp: int = 1) -> list[int]:
        par = {"pp": 3, "pp_microbatches": 4, "pp_schedule": schedule, "dp": dp}
        sc = Scenario.from_dict(
            {"model": "llama-3.1-8b", "precision": "bf16", "seq_len": 1024, "parallel": par}
        )
        top = {m.name: m for m in estimate(sc).ranks[1].moments}["backward_top"]
        return [i.bytes for i in top.items if "new gradient" in i.item]

    assert new_grads("1f1b") == [LLAMA8B_LARGEST_LAYER_PARAM_BYTES]
    assert (
        new_grads("gpipe") == []
    )  # every forward first: no gradient exists at the top of the first backward
    assert new_grads("1f1b", dp=2) == []  # DDP's buckets: not traced, not counted
