"""The reserved counter where torchtitan runs (docs/allocator.md, "torchtitan's published runs"):

- the fitted rule (the fallback where the stream does not model a step) gives churning memory the same unused share
  with ``expandable_segments:True`` as without; only the variable-shape term goes;
- a compiled step whose terms are all eager's (``replayable.compiled_as_eager``: torchtitan's per-block compile)
  replays on one GPU and on an FSDP2 rank, its stream eager's: the same reserved bytes as the eager step; not under
  tensor parallelism, nor where HF's compiled loss terms apply;
- against torchtitan's published December 2024 table (held out, nothing fitted): the eager FSDP rows within 3%
  of the replay, and no compiled FSDP row under it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from memsim_widget import Scenario, estimate
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.replayable import compiled_as_eager, replayable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import torchtitan_published as tt  # noqa: E402

SMALL: dict[str, Any] = {
    "model": "llama-3.2-1b",
    "precision": "bf16",
    "micro_batch_size": 2,
    "seq_len": 1024,
    "gpu": "h200",
}


def _estimate(**keys: Any) -> Any:
    return estimate(Scenario.from_dict({**SMALL, **keys}))


def _ctx(**keys: Any) -> Context:
    return Context(Scenario.from_dict({**SMALL, **keys}))


@pytest.mark.parametrize("padding", ["max_length", "longest"])
def test_the_fitted_rule_with_expandable_segments_keeps_the_transient_share(padding):
    """Fixed shapes: the fitted reserved is the same bytes in both modes; padded to the longest sample the
    expandable mode drops the variable term, so it reserves less (and never less than allocated)."""
    on, off = (
        _estimate(reserved_model="fitted", padding=padding, allocator_conf=f"expandable_segments:{flag}")
        for flag in ("True", "False")
    )
    assert on.peak_allocated_bytes == off.peak_allocated_bytes
    if padding == "max_length":
        assert on.peak_reserved_bytes == off.peak_reserved_bytes
    else:
        assert on.peak_allocated_bytes < on.peak_reserved_bytes < off.peak_reserved_bytes


def test_fitted_share_under_expandable_segments_is_above_a_few_percent():
    """The fallback's unused bytes under expandable segments are a third of the churning memory, not 2%: on the
    small Llama at least a tenth of (allocated - weights and optimizer states)."""
    est = _estimate(reserved_model="fitted", allocator_conf="expandable_segments:True")
    parts = est.components()
    states = parts["parameters"] + parts["optimizer_states"]  # the long-lived bytes the rule treats apart
    churn = est.peak_allocated_bytes - states
    assert est.peak_reserved_bytes - est.peak_allocated_bytes > 0.1 * churn


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"parallel": {"dp": 4, "zero": 3}, "num_gpus": 4},
    ],
    ids=["one GPU", "FSDP2 dp4"],
)
def test_a_compiled_torchtitan_step_replays_as_the_eager_one(layout):
    """torchtitan compiles each block apart: no traced compiled rule, no HF compiled loss, so the step replays and,
    with its loss eager (``compile_loss`` false, torchtitan of December 2024), its bytes are the eager step's (the
    same stream); its loss compiled apart too (the default) it still replays (tests/engine/
    test_compiled_loss_apart.py)."""
    keys = {"framework": "torchtitan", "precision": "amp-bf16", **layout}
    compiled = _ctx(compile=True, **keys)
    assert compiled_as_eager(compiled) and replayable(compiled)
    eager_est, compiled_est = _estimate(**keys), _estimate(compile=True, compile_loss=False, **keys)
    assert compiled_est.peak_allocated_bytes == eager_est.peak_allocated_bytes
    assert compiled_est.peak_reserved_bytes == eager_est.peak_reserved_bytes


def test_compiled_steps_that_do_not_replay_as_eager():
    """HF's compiled loss terms (the compiled formula in HF's loop) and tensor parallelism keep the fitted rule."""
    hf = _ctx(
        compile=True, activation_checkpointing="selective-op", parallel={"dp": 4, "zero": 3}, num_gpus=4
    )
    assert not compiled_as_eager(hf) and not replayable(hf)
    tp = _ctx(
        compile=True,
        framework="torchtitan",
        precision="amp-bf16",
        parallel={"dp": 2, "tp": 2, "zero": 3},
        num_gpus=4,
    )
    assert not compiled_as_eager(tp) and not replayable(tp)


def _row(name: str) -> tuple[float, Any]:
    measured, keys = next((m, k) for n, m, k in tt.ROWS if n == name)
    return measured, estimate(Scenario.from_dict({**tt.BASE, **keys}))


@pytest.mark.parametrize("name", ["T1 FSDP", "T3 FSDP (128 GPUs)"])
def test_torchtitan_eager_fsdp_rows_within_3_percent(name):
    """Llama 3.1 8B on 8 and 128 H100s (FSDP2, per-op checkpointing, expandable segments): the replay within 3%."""
    measured, est = _row(name)
    assert tt.rule(est) == "replay"
    assert abs(est.peak_reserved_bytes / 2**30 / measured - 1) < 0.03


@pytest.mark.parametrize("name", ["T1 FSDP + compile", "T3 FSDP + compile (128 GPUs)"])
def test_torchtitan_compiled_fsdp_rows_not_under(name):
    """The compiled rows replay the eager stream: over the GPU's figure (its compiled blocks save less), never
    under it."""
    measured, est = _row(name)
    assert tt.rule(est) == "replay"
    assert est.peak_reserved_bytes / 2**30 >= measured


@pytest.mark.parametrize(
    "name", ["2025 H200 8B FSDP 32 + compile + Float8", "2025 H200 8B FSDP 64 + compile + Float8"]
)
def test_torchtitan_june_2025_rows_replay_within_5_percent_and_not_under(name):
    """torchtitan of June 2025 compiles its loss apart and gathers the float8 weights in fp8 (held out): both
    modelled, the rows replay (+3.4% and +1.8% measured; +60% with the eager loss, +27% by the fitted rule)."""
    measured, est = _row(name)
    assert tt.rule(est) == "replay"
    assert 0 <= est.peak_reserved_bytes / 2**30 / measured - 1 < 0.05
