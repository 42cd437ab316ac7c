"""The answers users act on, from the commands of the README and docs/planner.md (issue 23's four cases).

Each case is the command a new user types; the answer must fit when estimated again, be exportable, and
give throughput figures a card can reach. The expected answers follow from the arithmetic, not from the
code's output: an 8B model trained with LoRA or QLoRA fits a 24 GB card (16 GB or 5 GB of base weights),
70B in NF4 is 35 GB of weights, which two 24 GB cards hold only sharded (ZeRO-3) or offloaded, and
DeepSpeed has no per-op checkpointing key.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _cli_run import run  # noqa: E402

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.speed.gpu_speed import matmul_efficiency
from memsim_widget.scenario import Scenario

#: The README's recommend example.
README_8B = {"model": "llama-3.1-8b", "gpu": "rtx-4090", "seq_len": 2048}
#: 70B QLoRA at 4096 tokens on two RTX 4090s.
QLORA_70B = {
    "model": "llama-3.1-70b",
    "gpu": "rtx-4090",
    "seq_len": 4096,
    "method": "qlora",
    "parallel": {"dp": 2},
}
QLORA_70B_FLAGS = ["--model", "llama-3.1-70b", "--gpu", "rtx-4090", "--method", "qlora", "--seq-len", "4096"]
#: Qwen3-30B-A3B full fine-tuning on one node of 8 H100s.
QWEN_MOE_FLAGS = ["--model", "qwen3-30b-a3b", "--gpu", "h100-sxm-80gb", "--gpus", "8"]


def recommend_json(capsys: pytest.CaptureFixture[str], scenario: dict[str, Any]) -> dict[str, Any]:
    code, out, err = run(capsys, "recommend", "-", "--json", stdin=json.dumps(scenario))
    assert code == 0, err
    return json.loads(out)


def fits_again(scenario: dict[str, Any], headroom: float = 0.10) -> bool:
    return estimate(Scenario.from_dict(scenario)).fits(headroom=headroom)


# ----- 1. the README's 8B on a 4090 ------------------------------------------------------------------


def test_readme_8b_on_a_4090_gets_fitting_answers(capsys):
    data = recommend_json(capsys, README_8B)
    assert data["fits"] is False
    recs = data["recommendations"]
    assert recs, "LoRA and QLoRA fit a 24 GB card: recommend must say so"
    for r in recs:
        assert r["fits"] and fits_again(r["scenario"])
    methods = {r["scenario"]["method"] for r in recs if r["changes_the_job"]}
    assert {"lora", "qlora"} <= methods
    jobs = [r["changes_the_job"] for r in recs]
    assert jobs == sorted(jobs), "changes of the job after the changes that keep it"


def test_readme_8b_text_never_says_nothing_fits(capsys):
    code, out, _ = run(capsys, "recommend", "-", stdin=json.dumps(README_8B))
    assert code == 0
    assert "no combination" not in out and "nothing fits" not in out
    assert "QLoRA" in out and "[changes the job]" in out


# ----- 2. 70B QLoRA on two 4090s ---------------------------------------------------------------------


def test_70b_qlora_on_two_4090s_recommend_finds_parameter_offload(capsys):
    data = recommend_json(capsys, QLORA_70B)
    recs = data["recommendations"]
    assert recs
    for r in recs:
        assert fits_again(r["scenario"])
    assert any(r["scenario"]["parallel"]["offload"] == "optimizer+params" for r in recs)


def test_70b_qlora_on_two_4090s_plan_searches_offload_when_nothing_fits(capsys):
    code, out, _ = run(capsys, "plan", *QLORA_70B_FLAGS, "--gpus", "2", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["fitting"] > 0 and data["candidates"]
    assert "optimizer+params" in data["widened"]["offload"], "the widening is said in the output"
    for c in data["candidates"]:
        assert fits_again(c["scenario"])
    code, out, _ = run(capsys, "plan", *QLORA_70B_FLAGS, "--gpus", "2")
    assert "nothing fit" in out and "parameter offload" in out


# ----- 3. Qwen3-30B-A3B on 8 H100s, exported for DeepSpeed ---------------------------------------------


@pytest.mark.parametrize("fmt", ["deepspeed", "accelerate"])
def test_moe_plan_export_pick_1_works(capsys, fmt, tmp_path):
    code, out, err = run(
        capsys, "plan", *QWEN_MOE_FLAGS, "--export", fmt, "--pick", "1", "--out", str(tmp_path)
    )
    assert code == 0, err
    assert "wrote" in out
    assert "left out" in err and "activation_checkpointing" in err  # says how many and why


# ----- 4. MFU of 70B QLoRA on a 4090 ------------------------------------------------------------------


def test_70b_qlora_on_a_4090_mfu_is_within_the_cards_reach(capsys):
    sc = Scenario.from_dict({**QLORA_70B, "parallel": {"dp": 1}})
    est = estimate(sc)
    eff = matmul_efficiency(Context(sc).gpu.generation)
    assert est.mfu <= eff, "MFU above the matmuls' own efficiency is out of reach"
    labels = " ".join(est.time_caveats)
    assert "QLoRA" in labels and "RTX 4090" in labels


# ----- how far it goes: the scenario's own layout, and any layout of the same GPUs --------------------


def test_70b_qlora_on_two_4090s_max_micro_batch_and_sequence_with_any_layout(capsys):
    """On its own layout (ZeRO-0 replicas of 35 GB of NF4 weights) nothing fits two 24 GB cards; sharded or
    offloaded, one sequence does: recommend says how far, on which layout, and each answer fits again."""
    data = recommend_json(capsys, QLORA_70B)
    assert data["max_micro_batch"] is None and data["max_seq_len"] is None
    for kind, key in (("max_micro_batch_searched", "micro_batch_size"), ("max_seq_len_searched", "seq_len")):
        r = data[kind]
        assert r is not None and r["num_gpus"] == 2 and r["scenario"]["method"] == "qlora"
        assert r["scenario"][key] == r["value"] and fits_again(r["scenario"])
        assert not fits_again({**r["scenario"], key: r["next_stop"]})
        assert r["zero"] == 3 or r["offload"] != "none", (
            "35 GB of weights on 24 GB cards: sharded or offloaded"
        )
    assert data["max_seq_len_searched"]["value"] >= 4096, "the job's own 4096 tokens fit with some layout"
    code, out, _ = run(capsys, "recommend", "-", stdin=json.dumps(QLORA_70B))
    assert code == 0
    lines = out.splitlines()
    mb = next(i for i, line in enumerate(lines) if line.startswith("max micro-batch"))
    assert lines[mb] == "max micro-batch   none fits (this layout)"
    r = data["max_micro_batch_searched"]
    assert f"any layout       {r['value']} on 2 GPUs as {r['layout']}" in out
    assert f"{r['next_stop']} fits no layout" in out


def test_70b_qlora_on_4090s_min_gpus_with_any_layout_and_knobs(capsys):
    """35 GB of NF4 weights do not fit one 24 GB card as a replica, but sharded (ZeRO-3) or offloaded to the
    host they do: the fewest GPUs is at most the two the issue's plan found fits on, its layout and knobs are
    named, and on one GPU it can only be parameter offload. The scenario's own knobs (no checkpointing: 4096
    tokens of 70B activations, ~100 GiB) fit no count, and the text says so on its own line."""
    data = recommend_json(capsys, QLORA_70B)
    r = data["min_gpus_searched"]
    assert r is not None and 1 <= r["value"] <= 2 and r["num_gpus"] == r["value"]
    sc = r["scenario"]
    assert (sc["model"], sc["method"], sc["gpu"], sc["seq_len"]) == (
        "llama-3.1-70b",
        "qlora",
        "rtx-4090",
        4096,
    )
    assert fits_again(sc)
    if r["value"] == 1:
        assert r["offload"] == "optimizer+params" and r["next_stop"] is None
    else:
        assert r["zero"] == 3 or r["offload"] == "optimizer+params"
        assert r["next_stop"] == 1
    assert data["min_gpus"] is None and data["min_gpus_reason"]
    # plan itself, as docs/planner.md's command, finds fits on that many GPUs
    code, out, _ = run(capsys, "plan", *QLORA_70B_FLAGS, "--gpus", str(r["value"]), "--json")
    assert code == 0 and json.loads(out)["fitting"] > 0
    code, out, _ = run(capsys, "recommend", "-", stdin=json.dumps(QLORA_70B))
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("min GPUs"))
    assert lines[i] == f"min GPUs          {r['value']} as {r['layout']}"
    assert (
        "any layout and knobs" in lines[i + 1]
        and f"the cheapest of {r['reaching']:,} that fit" in lines[i + 1]
    )
    assert lines[i + 2].startswith("  these knobs      none: ")
