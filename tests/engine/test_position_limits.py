"""A sequence longer than a learned position table is an error, in every front end (issue 12).

BERT and GPT-2 index a learned table of ``max_position_embeddings`` / ``n_positions`` rows, RoBERTa from
``pad_token_id + 1`` on: transformers fails past its end ("index out of range in self"), so the scenario is
refused with one line naming ``seq_len`` and the longest the table allows. RoPE and relative positions bound
nothing; ViT's sequence is fixed by its patches.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from memsim_widget.catalog.models import architecture_for
from memsim_widget.cli import main
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.plan.recommend import recommend
from memsim_widget.plan.search import plan
from memsim_widget.scenario import Scenario

TINY_GPT2 = {
    "model_type": "gpt2",
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "vocab_size": 100,
    "n_positions": 200,
}
TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
    "max_position_embeddings": 96,
}
TINY_ROBERTA = {**TINY_BERT, "model_type": "roberta", "pad_token_id": 0}  # positions from 1: 95 usable

#: (model, the longest sequence its table allows), from each config's own keys.
LIMITS: list[tuple[Any, int]] = [
    ("gpt2", 1024),  # n_positions
    ("gpt2-xl", 1024),
    ("bert-base-uncased", 512),  # max_position_embeddings
    ("roberta-base", 512),  # 514 rows, padding_idx 1: positions 2..513
    ("roberta-large", 512),
    (TINY_GPT2, 200),
    (TINY_BERT, 96),
    (TINY_ROBERTA, 95),
]


@pytest.mark.parametrize(("model", "limit"), LIMITS, ids=lambda v: v if isinstance(v, str) else None)
def test_the_table_length_is_accepted_and_one_more_is_refused(model: Any, limit: int) -> None:
    assert architecture_for(model).max_seq_len == limit
    assert estimate(Scenario(model=model, seq_len=limit)).peak_tensor_bytes > 0
    with pytest.raises(ScenarioError) as info:
        estimate(Scenario(model=model, seq_len=limit + 1))
    assert info.value.field == "seq_len"
    assert f"at most {limit}" in str(info.value) and f"got {limit + 1}" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_default_sequence_is_refused_for_gpt2() -> None:
    """The default scenario's 2048 tokens are twice GPT-2's table: an error, not a number."""
    with pytest.raises(ScenarioError, match=r"^seq_len: must be at most 1024 for this model"):
        estimate(Scenario(model="gpt2"))


@pytest.mark.parametrize(
    "model", ["llama-3.2-1b", "qwen2.5-0.5b", "modernbert-base", "t5-base", "pythia-160m"]
)
def test_rope_and_relative_positions_accept_long_sequences(model: str) -> None:
    assert architecture_for(model).max_seq_len is None
    assert estimate(Scenario(model=model, seq_len=65536)).peak_tensor_bytes > 0


def test_vit_sequence_is_fixed_by_its_patches() -> None:
    est = estimate(Scenario(model="vit-base-patch16-224", seq_len=8192))
    assert est.arch.fixed_seq_len == 197 and est.arch.max_seq_len is None


def test_cli_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model", "bert-base-uncased", "--seq-len", "513", "--json"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.endswith("seq_len: must be at most 512 for this model (the longest sequence its learned position "
                        "table can index), got 513")  # fmt: skip
    assert len(err.splitlines()) == 1


def test_cli_accepts_the_table_length(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "roberta-base", "--seq-len", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scenario"]["seq_len"] == 512


def test_widget_shows_the_error_in_place() -> None:
    pytest.importorskip("anywidget")
    from memsim_widget.widget import MemSim

    sim = MemSim(model="gpt2", seq_len=1024, charts_js=False)
    good = sim.result
    sim.scenario_data = {**sim.scenario_data, "seq_len": 2048}  # what the front end writes
    assert sim.error_field == "seq_len" and "at most 1024" in sim.error
    assert sim.result == good and sim.scenario.seq_len == 1024, "the last valid result stays"
    with pytest.raises(ScenarioError):
        sim.set(seq_len=1025)


@pytest.mark.parametrize(("model", "limit"), [("gpt2", 1024), ("bert-base-uncased", 512), (TINY_GPT2, 200)])
def test_recommend_longest_sequence_stops_at_the_table(model: Any, limit: int) -> None:
    """On an H100 far longer sequences would fit in memory; the table ends first (200: not a multiple of the
    128-token search step, the bound itself)."""
    rec = recommend({"model": model, "seq_len": 128, "gpu": "h100-sxm-80gb"})
    assert rec.max_seq_len == limit


def test_recommend_longest_sequence_for_rope_is_memory_bound() -> None:
    rec = recommend({"model": "modernbert-base", "seq_len": 128, "gpu": "h100-sxm-80gb"})
    assert rec.max_seq_len is not None and rec.max_seq_len > 8192


def test_plan_refuses_a_sequence_past_the_table() -> None:
    with pytest.raises(ScenarioError) as info:
        plan("gpt2", "h100-sxm-80gb", 1, seq_len=2048)
    assert info.value.field == "seq_len"
