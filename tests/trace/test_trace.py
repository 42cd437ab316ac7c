"""Tests of the fake-tensor training-memory tracer (memsim_widget.trace)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memsim_widget.trace.inspect import forward_survivors  # noqa: E402
from memsim_widget.trace.run import trace_training  # noqa: E402

#: Every test here runs a real trace on fake tensors: behind the slow marker (scripts/dev test runs it).
pytestmark = pytest.mark.slow

TINY_LLAMA = dict(
    model_type="llama",
    hidden_size=64,
    intermediate_size=172,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    vocab_size=128,
)

D_IN, D_H, D_OUT, B = 64, 128, 32, 16


def _mlp() -> torch.nn.Module:
    """Two Linear layers with a ReLU between them (fp32)."""
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_H), torch.nn.ReLU(), torch.nn.Linear(D_H, D_OUT))


def _mlp_batch() -> tuple[torch.Tensor]:
    """One input batch for the MLP."""
    return (torch.randn(B, D_IN),)


def _mse(out: torch.Tensor, _batch: object) -> torch.Tensor:
    """Mean of squares of the output."""
    return out.pow(2).mean()


def test_mlp_hand_count_sgd() -> None:
    """Peak and end-of-forward bytes of a 2-layer MLP with SGD equal a hand count, byte for byte."""
    f = 4  # fp32
    params = f * (D_IN * D_H + D_H + D_H * D_OUT + D_OUT)  # W1, b1, W2, b2
    grads = params  # one gradient per parameter after backward (set_to_none before the next step)
    x = f * B * D_IN  # the input batch, saved by the first addmm (for dW1)
    h1 = f * B * D_H  # relu output, saved by relu (threshold_backward) and by the second addmm (for dW2)
    out = f * B * D_OUT  # model output, saved by pow
    loss = f  # scalar loss, held by the loop until backward finishes
    seed = f  # ones_like gradient seed of backward
    # The pre-activation of layer 1 (addmm output) is freed at once: relu saves its output, not its input.
    end_of_forward = params + x + h1 + out + loss
    # Backward peak: computing db1 (sum) while everything below is alive: dW2, db2, dW1 (grads except db1 done),
    # db1 itself, and the grad w.r.t. the pre-activation (threshold_backward output, B x D_H) that feeds dW1/db1.
    # By then h1, out and the intermediate output grads were freed by autograd.
    peak = params + x + loss + seed + grads + f * B * D_H
    r = trace_training(_mlp, _mlp_batch, precision="fp32", optimizer="sgd", loss_fn=_mse, progress=False)
    assert r.peak_bytes == peak == 111_880
    assert r.step1_peak_bytes == peak
    assert (r.peak_phase, r.peak_op) == ("backward", "sum")
    tr = r.tracker
    assert tr.live_bytes_at(tr.mark_seq(2, "backward")) == end_of_forward == 64_132
    assert r.by_role["parameter"] == params and r.by_role["gradient"] == grads
    assert sum(r.by_role.values()) == r.peak_bytes
    assert r.model_state_bytes == {"parameter": params, "buffer": 0, "gradient": grads, "optimizer_state": 0}


def test_mlp_hand_count_adamw_foreach() -> None:
    """AdamW foreach peaks in optimizer.step: weights + grads + 2 states + one sqrt buffer (+ step scalars)."""
    f = 4
    params = f * (D_IN * D_H + D_H + D_H * D_OUT + D_OUT)
    steps_scalars = 4 * 4  # one fp32 'step' scalar per parameter tensor
    x = f * B * D_IN
    expected = params * 5 + steps_scalars + x  # p + g + exp_avg + exp_avg_sq + _foreach_sqrt(exp_avg_sq)
    r = trace_training(
        _mlp, _mlp_batch, optimizer="adamw", optimizer_impl="foreach", loss_fn=_mse, progress=False
    )
    assert r.peak_bytes == expected
    assert (r.peak_phase, r.peak_op) == ("optimizer_step", "_foreach_sqrt")
    assert r.by_role["optimizer_state"] == 2 * params + steps_scalars
    assert r.by_role["temporary"] == params
    json.dumps(r.to_dict())  # plain data


@pytest.mark.parametrize(
    "kw",
    [
        dict(precision="bf16"),
        dict(precision="fp32", attention="eager"),
        dict(precision="amp-bf16"),
        dict(precision="bf16", gradient_checkpointing=True),
        dict(precision="amp-bf16", gradient_checkpointing=True),  # CUDA's fp32 ops in the recompute too
        dict(precision="bf16", optimizer_impl="for-loop"),
        dict(precision="bf16", lora={"r": 4, "target_modules": ["q_proj", "v_proj"]}),
    ],
)
def test_fake_equals_real(kw: dict) -> None:
    """A real CPU run traced by the same tracker gives exactly the fake-tensor figures."""
    from memsim_widget.trace.hf import trace_hf

    fake = trace_hf(TINY_LLAMA, micro_batch_size=2, seq_len=24, progress=False, **kw)
    real = trace_hf(TINY_LLAMA, micro_batch_size=2, seq_len=24, progress=False, fake=False, **kw)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.step1_peak_bytes == real.step1_peak_bytes
    assert (fake.peak_phase, fake.peak_op) == (real.peak_phase, real.peak_op)
    assert fake.phase_peaks == real.phase_peaks
    assert fake.by_role == real.by_role


def test_mlp_fake_equals_real() -> None:
    """Same check for the toy MLP with every optimizer implementation."""
    for opt, impl in [
        ("adamw", "foreach"),
        ("adamw", "fused"),
        ("adamw", "for-loop"),
        ("sgd-momentum", "foreach"),
    ]:
        kw = dict(optimizer=opt, optimizer_impl=impl, loss_fn=_mse, progress=False)
        a = trace_training(_mlp, _mlp_batch, **kw)
        b = trace_training(_mlp, _mlp_batch, fake=False, **kw)
        assert (a.peak_bytes, a.step1_peak_bytes, a.phase_peaks) == (
            b.peak_bytes,
            b.step1_peak_bytes,
            b.phase_peaks,
        )


def test_against_pytorch_mem_tracker() -> None:
    """Cross-check once against torch.distributed._tools.mem_tracker.MemTracker (real CPU run).

    MemTracker works on CPU (it rounds to 512 B only on CUDA) but refuses a second iteration unless
    ``reset_mod_stats()`` is called first; its global peak survives the reset.
    """
    mt_mod = pytest.importorskip("torch.distributed._tools.mem_tracker")
    from memsim_widget.trace.hf import build_hf_config, build_hf_model, trace_hf

    for seq_len in (16, 256):  # small T peaks in optimizer.step, large T at the start of backward
        cfg = build_hf_config(TINY_LLAMA, "sdpa")
        torch.manual_seed(0)
        model = build_hf_model(cfg, torch.float32, "sdpa")
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        mt = mt_mod.MemTracker()
        mt.track_external(model, opt)
        with mt:
            for _ in range(2):
                mt.reset_mod_stats()
                ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, seq_len))
                out = model(input_ids=ids, labels=ids)
                loss = out.loss
                del out
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
                del ids
        theirs = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        ours = trace_hf(TINY_LLAMA, micro_batch_size=2, seq_len=seq_len, precision="fp32", progress=False)
        assert ours.tracker.peak_bytes == theirs


def test_tiny_llama_two_steps() -> None:
    """Step 2 (optimizer state exists) peaks at least as high as step 1 with AdamW."""
    from memsim_widget.trace.hf import trace_hf

    r = trace_hf(TINY_LLAMA, micro_batch_size=2, seq_len=32, optimizer="adamw", progress=False)
    assert r.peak_step == 2
    assert r.peak_bytes >= r.step1_peak_bytes
    p = r.model_state_bytes["parameter"]
    assert r.model_state_bytes["gradient"] == p
    assert r.parameters * 2 == p  # bf16
    assert r.timeline and len(r.timeline) <= 2000
    assert r.top and r.top[0]["bytes"] >= r.top[-1]["bytes"]
    assert {"bytes", "shape", "dtype", "role", "op"} <= set(r.top[0])


def _layer_bytes(res: object, layer: int = 1) -> int:
    """Bytes of storages created in decoder layer ``layer`` that survive to the start of backward."""
    return sum(r.nbytes for r in forward_survivors(res.tracker, 2) if r.layer == layer)


@pytest.mark.parametrize("b,s", [(2, 40), (3, 24)])
def test_llama_layer_formulas(b: int, s: int) -> None:
    """Calibration facts: bytes saved per Llama decoder layer (SDPA, GQA) in bf16, fp32 and eager."""
    from memsim_widget.trace.hf import trace_hf

    h, i_, a, kv = 64, 172, 4, 2
    t, kvw = b * s, kv * (h // a)
    bf16 = trace_hf(TINY_LLAMA, micro_batch_size=b, seq_len=s, progress=False)
    assert _layer_bytes(bf16) == 20 * t * h + 4 * t * kvw + 8 * t * i_ + 8 * t + 4 * t * a
    fp32 = trace_hf(TINY_LLAMA, micro_batch_size=b, seq_len=s, precision="fp32", progress=False)
    assert _layer_bytes(fp32) == 32 * t * h + 8 * t * kvw + 16 * t * i_ + 8 * t + 4 * t * a
    eager = trace_hf(TINY_LLAMA, micro_batch_size=b, seq_len=s, attention="eager", progress=False)
    assert _layer_bytes(eager) == 24 * t * h + 8 * t * i_ + 8 * t + 6 * b * a * s * s


def test_trace_hf_rejects_qlora() -> None:
    """QLoRA needs bitsandbytes CUDA kernels: refused with an explanation."""
    from memsim_widget.trace.hf import trace_hf

    with pytest.raises(NotImplementedError, match="bitsandbytes"):
        trace_hf(TINY_LLAMA, micro_batch_size=1, seq_len=8, qlora=True)
