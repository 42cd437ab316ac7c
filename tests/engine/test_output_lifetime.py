"""How long the loop holds the model output (``output_lifetime``): HF Trainer drops it before backward, the
hand-written loop keeps the logits and the KV cache through backward (``backward``) or the optimizer step
(``step``). Expected bytes are written from b, s, V and the dtype of the step, not read from the engine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import fidelity_cases
import pytest

from memsim_widget.cli import main
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.trace.traceable import trace_kwargs
from memsim_widget.widget.controls import build_options

#: A small Llama: h=256, 8 heads of d=32, 4 kv heads (kv*d = 128), 4 layers, V=1000.
LLAMA = fidelity_cases.LLAMA  # h=256, I=688, 8 heads, 4 kv heads, 4 layers, V=1000, untied
B, S, V, LAYERS, KVD = 2, 128, 1000, 4, 128
T = B * S
SMALL = {"model": LLAMA, "micro_batch_size": B, "seq_len": S}


def _moment(est, name: str):
    return next(m for m in est.worst.moments if m.name == name)


def _item(moment, prefix: str):
    return next(i for i in moment.items if i.item.startswith(prefix))


@pytest.mark.parametrize(("precision", "logit_bytes"), [("bf16", 2), ("fp32", 4), ("amp-bf16", 2)])
def test_kept_logits_at_backward_start_are_the_compute_dtype_t_by_v(precision, logit_bytes):
    est = estimate({**SMALL, "precision": precision, "output_lifetime": "backward"})
    item = _item(_moment(est, "backward_start"), "logits held by the loop's model output")
    assert item.bytes == logit_bytes * B * S * V
    assert "output_lifetime 'backward'" in item.formula and f"{logit_bytes} B x T x V, V={V}" in item.formula


def test_bf16_sdpa_backward_start_grows_by_the_logits_only():
    """SDPA saves the cache's k and v itself: at the start of backward only the logits are extra."""
    trainer = estimate(SMALL)
    kept = estimate({**SMALL, "output_lifetime": "backward"})
    start = [_moment(e, "backward_start").tensor_bytes for e in (trainer, kept)]
    assert start[1] - start[0] == 2 * T * V


def test_step_holds_logits_and_the_whole_kv_cache_in_the_optimizer_step():
    backward = estimate({**SMALL, "output_lifetime": "backward"})
    step = estimate({**SMALL, "output_lifetime": "step"})
    at = [_moment(e, "optimizer_step").tensor_bytes for e in (backward, step)]
    cache = LAYERS * (2 + 2) * T * KVD  # bf16 k and v of every layer
    assert at[1] - at[0] == 2 * T * V + cache
    item = _item(_moment(step, "optimizer_step"), "KV cache held by the loop's model output")
    assert item.bytes == cache


def test_autocast_keeps_the_fp32_k_of_the_cache_beyond_what_sdpa_saves():
    """Under autocast RoPE runs in fp32: the cache's k is fp32 while SDPA saves a 16-bit cast."""
    trainer = estimate({**SMALL, "precision": "amp-bf16"})
    kept = estimate({**SMALL, "precision": "amp-bf16", "output_lifetime": "backward"})
    start = [_moment(e, "backward_start").tensor_bytes for e in (trainer, kept)]
    assert start[1] - start[0] == 2 * T * V + LAYERS * 4 * T * KVD


MONOTONE = [
    {"model": "llama-3.2-1b", "seq_len": 1024, "micro_batch_size": 2},
    {"model": "llama-3.2-1b", "seq_len": 64},
    {"model": "llama-3.1-8b", "method": "lora", "precision": "amp-bf16"},
    {"model": "llama-3.1-8b", "method": "qlora", "activation_checkpointing": "full"},
    {"model": "qwen2.5-0.5b", "attention": "eager", "seq_len": 1024},
    {"model": "llama-3.1-8b", "loss": "chunked", "parallel": {"pp": 2, "pp_microbatches": 4}},
    {"model": "llama-3.1-8b", "framework": "torchtune"},
    {"model": "gpt2", "seq_len": 1024, "precision": "fp32", "optimizer": "sgd-momentum"},
]


@pytest.mark.parametrize("data", MONOTONE, ids=lambda d: str(d["model"]) + "-" + str(len(d)))
def test_the_longer_the_outputs_live_the_higher_the_peak(data):
    peaks = [estimate({**data, "output_lifetime": lt}) for lt in ("trainer", "backward", "step")]
    for key in ("peak_tensor_bytes", "peak_allocated_bytes"):
        values = [getattr(e, key) for e in peaks]
        assert values == sorted(values), (key, values)


def test_plain_loop_shapes_a_small_step_peak_in_the_optimizer_step():
    """b1 s64 peaks in the step; only ``step`` keeps the outputs there."""
    data = {"model": LLAMA, "micro_batch_size": 1, "seq_len": 64}
    trainer, backward, step = (
        estimate({**data, "output_lifetime": lt}) for lt in ("trainer", "backward", "step")
    )
    assert trainer.peak_phase == backward.peak_phase == step.peak_phase == "optimizer_step"
    assert trainer.peak_tensor_bytes == backward.peak_tensor_bytes < step.peak_tensor_bytes


def test_unset_means_the_frameworks_own():
    hf = {"model": "llama-3.2-1b", "seq_len": 1024}
    assert (
        estimate(hf).peak_allocated_bytes
        == estimate({**hf, "output_lifetime": "trainer"}).peak_allocated_bytes
    )
    tt = {**hf, "framework": "torchtune"}
    assert estimate(tt).worst.moments == estimate({**tt, "output_lifetime": "backward"}).worst.moments
    dropped = estimate({**tt, "output_lifetime": "trainer"})
    assert not any("held by the loop" in i.item for m in dropped.worst.moments for i in m.items)


def test_scenario_json_round_trip_and_unset_key_stays_out_of_saved_files():
    unset = Scenario(model="gpt2")
    assert "output_lifetime" not in unset.to_dict(), "files saved before the key read and print the same"
    assert Scenario.from_json(unset.to_json()) == unset
    for lifetime in ("trainer", "backward", "step"):
        sc = Scenario(model="gpt2", output_lifetime=lifetime)
        assert sc.to_dict()["output_lifetime"] == lifetime
        assert Scenario.from_json(sc.to_json()) == sc
    assert Scenario.from_dict({"output_lifetime": None}) == Scenario()


def test_bad_lifetime_names_the_field_and_the_choices():
    with pytest.raises(ScenarioError) as info:
        Scenario(output_lifetime="forever")
    assert info.value.field == "output_lifetime"
    assert "trainer, backward, step" in str(info.value)


def test_cli_flag_sets_the_lifetime(capsys):
    code = main(["estimate", "--model", "gpt2", "--seq-len", "1024", "--output-lifetime", "step", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["scenario"]["output_lifetime"] == "step"
    expected = estimate({"model": "gpt2", "seq_len": 1024, "output_lifetime": "step"})
    assert out["peak_allocated_bytes"] == expected.peak_allocated_bytes


def test_cli_bad_lifetime_exits_2_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "estimate", "--output-lifetime", "stpe"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "output_lifetime" in lines[0]
    assert "did you mean 'step'" in lines[0]


def test_trace_runs_the_resolved_lifetime():
    assert trace_kwargs(Scenario())["output_lifetime"] == "trainer"
    assert trace_kwargs(Scenario(framework="torchtune"))["output_lifetime"] == "backward"
    assert trace_kwargs(Scenario(output_lifetime="step"))["output_lifetime"] == "step"


def test_widget_offers_the_unset_choice_and_disables_it_for_megatron():
    opts = build_options(Scenario().to_dict())
    assert opts["choices"]["output_lifetime"] == [None, "trainer", "backward", "step"]
    assert "output_lifetime" not in opts["disabled"]
    megatron = build_options({**Scenario().to_dict(), "framework": "megatron"})
    assert "output_lifetime" in megatron["disabled"]


@pytest.mark.parametrize(
    "name", ["llama bf16 sdpa b2 s512 (outputs kept: step)", "llama bf16 sdpa b1 s64 (outputs kept: step)"]
)
@pytest.mark.slow
def test_engine_within_one_percent_of_the_plain_loop_trace(name):
    """Traced with the loop that keeps the outputs; the trainer-loop engine is 2.5% under on the first."""
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r
