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
    # pipelines over FSDP are under their held-out traces (docs/fidelity-parallel.md); GPipe's last stage is
    # modelled since (its second micro-batch's backward: the fidelity suite's GPipe [2, 2] and [3, 1] cases)
    from memsim_widget.engine.caveats import pipeline_under_caveat

    def said(parallel: dict) -> str:
        return pipeline_under_caveat(Scenario.from_dict({"model": "llama-3.1-8b", "parallel": parallel}))

    assert said({"pp": 2, "pp_schedule": "gpipe"}) == ""
    assert "FSDP" in said({"pp": 2, "dp": 2, "zero": 3})
    assert "FSDP" in said({"pp": 2, "dp": 2, "zero": 3, "pp_schedule": "gpipe"})
    assert said({"pp": 2}) == said({"dp": 2, "zero": 3}) == ""
