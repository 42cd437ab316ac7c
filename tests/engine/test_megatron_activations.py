"""Megatron-LM's per-layer activations: Korthikanti et al. 2022 Table 2 (arXiv 2205.05198), and what changes for
grouped key/value heads and models trained without hidden dropout (engine/activations/megatron.py)."""

from __future__ import annotations

import pytest

from memsim_widget.engine.activations.megatron import megatron_activations
from memsim_widget.engine.context import Context
from memsim_widget.scenario import Scenario

#: A GPT-style layer as Table 2 has it: multi-head attention, GELU MLP of 4h, hidden dropout.
GPT = {"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 8, "n_positions": 1024, "vocab_size": 1000,
       "resid_pdrop": 0.1}  # fmt: skip
#: A Llama-style layer: 8 heads over 2 kv heads (GQA), SwiGLU MLP of 688, no dropout.
LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip
S, B, H = 512, 2, 256


def _layer(model: dict, **extra: object) -> int:
    sc = Scenario.from_dict({"model": model, "framework": "megatron", "seq_len": S, "micro_batch_size": B,
                             **extra})  # fmt: skip
    return int(megatron_activations(Context(sc)).per_layer[0].bytes)


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False), (2, True)])
def test_a_multi_head_gelu_layer_with_dropout_is_table_2(tp: int, sp: bool) -> None:
    """Table 2: s*b*h*(10 + 24/t) without sequence parallelism, s*b*h*34/t with it (flash attention: no s^2)."""
    got = _layer(GPT, parallel={"tp": tp, "sequence_parallel": sp})
    assert got == (S * B * H * 34 // tp if sp else S * B * H * (10 + 24 // tp))


def test_grouped_kv_heads_and_no_dropout_drop_what_table_2_assumed() -> None:
    """Per token, in h bytes: norm inputs 4, QKV and fc1 inputs 4, Q and attention output 4, K and V 4 x 2/8
    (two kv heads of eight), SwiGLU 6 x 688/256; no dropout mask (Llama runs with dropout 0)."""
    expected = S * B * (H * (4 + 4 + 4 + 4 * 2 / 8) + 6 * 688)
    assert _layer(LLAMA) == pytest.approx(expected, rel=1e-12)


def test_hidden_dropout_adds_two_one_byte_masks_per_token() -> None:
    assert _layer({**LLAMA, "resid_pdrop": 0.1}) - _layer(LLAMA) == pytest.approx(2 * S * B * H, rel=1e-12)
