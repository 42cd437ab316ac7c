"""``compile_loss``: a loop that computes the loss outside the model (torchtitan) and compiles it apart
(``frameworks.loss_compiled_apart``): its terms (``activations/loss.compiled_apart_terms``, traced in
tests/trace/test_trace_compiled_loss.py), its place in the allocation stream, and the key's rules."""

from __future__ import annotations

import pytest
from fidelity_cases import LLAMA_H512_V32K

from memsim_widget import Scenario, estimate
from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import rank_stream
from memsim_widget.engine.counters.allocator import FREE
from memsim_widget.errors import ScenarioError

B, S, V = 2, 384, 32_000  # T x V apart from the root unit's V x h sizes
T = B * S
TT = {"model": LLAMA_H512_V32K, "micro_batch_size": B, "seq_len": S, "framework": "torchtitan",
      "precision": "amp-bf16", "compile": True}  # fmt: skip
FSDP = {**TT, "parallel": {"dp": 4, "zero": 3}}


def _sc(**keys: object) -> Scenario:
    return Scenario.from_dict({**TT, **keys})


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({"compile": False, "compile_loss": True}, "set compile to true"),
        ({"compile_loss": "yes"}, "true or false"),
    ],
)
def test_compile_loss_is_a_bool_for_a_compiled_step(keys: dict, says: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _sc(**keys)
    assert err.value.field == "compile_loss" and says in str(err.value)


def test_compile_loss_is_refused_where_the_model_computes_its_loss() -> None:
    """transformers' model computes its loss inside its compiled graph: the engine refuses the key, naming it."""
    with pytest.raises(ScenarioError) as err:
        estimate(_sc(framework="hf", compile_loss=False))
    assert err.value.field == "compile_loss" and "under hf the loss is part of the model" in str(err.value)


def test_torchtitan_compiles_its_loss_unless_told_not_to() -> None:
    """Unset, the torchtitan profile's default (``compiles_loss``: its loss compiled since 2025); false, the eager
    loss's terms; the key round-trips through ``to_dict`` only when set."""
    names = [t.name for t in activations(Context(_sc())).loss_saved]
    assert names[0].startswith("loss compiled apart")
    assert _sc(compile_loss=True).to_dict()["compile_loss"] is True
    assert "compile_loss" not in _sc().to_dict()
    eager = activations(Context(_sc(compile_loss=False)))
    assert [t.name for t in eager.loss_saved] == [
        t.name for t in activations(Context(_sc(compile=False))).loss_saved
    ]


def test_under_loss_parallel_the_loss_keeps_eagers_kernels() -> None:
    """DTensor's cross-entropy compiled is untraced: a tp rank keeps the eager loss-parallel buffers, and says so."""
    sc = _sc(parallel={"tp": 2})
    names = [t.name for t in activations(Context(sc)).loss_backward]
    assert all(n.startswith("loss-parallel backward") for n in names)
    assert any("loss parallel keeps eager's kernels" in c for c in estimate(sc).caveats)


def _loss_backward_allocs(sc: Scenario) -> list[int]:
    """The sizes the stream allocates in the first micro-batch's loss backward (its phase marks; the T x V ones
    are whole multiples of T x V, the root unit's V x h ones are not at these shapes)."""
    ctx = Context(sc)
    s = rank_stream(ctx, ctx.stages[0])
    marks = [(at, label) for at, label in s.marks]
    start = next(at for at, label in marks if label.endswith("loss backward"))
    end = next(at for at, label in marks if at > start)
    return [size for _, size, _ in s.events[start:end] if size != FREE]


@pytest.mark.parametrize("layout", [{}, {"parallel": {"dp": 4, "zero": 3}}], ids=["one-gpu", "fsdp2-dp4"])
def test_the_stream_makes_only_the_logits_gradient_in_the_loss_backward(layout: dict) -> None:
    """Inductor fuses nll_loss's fp32 buffer into the kernel that writes the logits' gradient (its joint-graph
    pass; traced with it in tests/trace/test_trace_compiled_loss.py): the stream's loss backward makes one
    bf16 T x V tensor (FSDP2's root re-gather comes after it), where the eager loss makes fp32 ones."""
    compiled = [x for x in _loss_backward_allocs(_sc(**layout)) if x % (T * V) == 0]
    assert compiled == [2 * T * V]
    eager = [x for x in _loss_backward_allocs(_sc(compile_loss=False, **layout)) if x % (T * V) == 0]
    assert 4 * T * V in eager


def test_the_root_reshards_after_the_model_returns_its_logits() -> None:
    """Under FSDP2 the root's post-forward runs once the model has returned (torchtitan computes the loss outside
    it): the saved logits are made before the root's unsharded parameters are freed, as the eager loop's are."""
    ctx = Context(Scenario.from_dict(FSDP))
    s = rank_stream(ctx, ctx.stages[0])
    start = next(at for at, label in s.marks if label.endswith(" loss"))
    assert s.events[start][1] == 2 * T * V  # the logits, before any free
    assert s.events[start + 1][1] == FREE  # then the root resharded


def test_the_compiled_loss_lowers_both_counters_and_is_replayed() -> None:
    """The loss's backward peak falls from 12 to 6 B x T x V; the FSDP2 rank's reserved is the replay's."""
    on, off = (
        estimate(Scenario.from_dict(FSDP)),
        estimate(Scenario.from_dict({**FSDP, "compile_loss": False})),
    )
    assert on.worst.peak_allocated_bytes < off.worst.peak_allocated_bytes
    assert on.worst.peak_reserved_bytes < off.worst.peak_reserved_bytes
    assert "replayed" in on.worst.reserved.formula
