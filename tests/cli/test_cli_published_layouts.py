"""The largest published training layouts estimate from the command line (issue 24: "no refusal for layouts
PyTorch runs"): Llama 3.1 405B on 16 pipeline ranks x 4 virtual stages, DeepSeek-V3 on 16 stages, both with
layers that the stages do not divide, and Qwen3-235B-A22B with its experts folded over tensor parallelism."""

from __future__ import annotations

import json

import pytest
from _cli_run import run  # noqa: E402

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

#: Llama 3 paper (arXiv 2407.21783, section 3.3): 126 layers, pp 16 with interleaving, tp 8; torchtitan's and
#: Megatron's embedding/loss accounting give ranks 7, 8 x 14, 7.
LLAMA_405B = {
    "model": "llama-3.1-405b",
    "parallel": {"pp": 16, "virtual_stages": 4, "pp_schedule": "interleaved", "pp_microbatches": 32, "tp": 8},
}
#: DeepSeek-V3 (61 layers) on 16 pipeline stages with 64-way expert parallelism over dp 64 (arXiv 2412.19437).
DEEPSEEK_V3 = {"model": "deepseek-v3", "parallel": {"pp": 16, "pp_microbatches": 16, "dp": 64, "ep": 64}}
#: Megatron-Core's MoE parallel folding: ep 32 spans tp 2 x dp 16 (arXiv 2504.14960).
QWEN3_235B = {"model": "qwen3-235b-a22b", "parallel": {"tp": 2, "dp": 16, "ep": 32, "zero": 3}}


@pytest.mark.parametrize(
    ("data", "layers"),
    [
        (LLAMA_405B, [7] + [8] * 14 + [7]),  # (126 + 2) / 64 chunks = 2, one fewer on the first and last
        (DEEPSEEK_V3, [3] + [4] * 14 + [2]),  # 63 = 16 x 3 + 15: 4 on stages 0-14, less the ends
        (QWEN3_235B, [94]),
    ],
    ids=["llama-405b-pp16-v4", "deepseek-v3-pp16", "qwen3-235b-ep32-tp2-dp16"],
)
def test_the_published_layout_estimates_with_each_stages_layers(capsys, tmp_path, data, layers):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    code, out, err = run(capsys, "estimate", str(path), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert [r["layers"] for r in got["per_rank"]] == layers
    assert got["peak_allocated_bytes"] == estimate(Scenario.from_dict(data)).peak_allocated_bytes


def test_the_folded_experts_are_named_in_the_role():
    est = estimate(Scenario.from_dict(QWEN3_235B))
    role = est.role(est.ranks[0])
    assert "1/32 of the experts" in role and "folded over the TP group" in role


def test_an_interleaved_rank_names_its_chunks():
    est = estimate(Scenario.from_dict(LLAMA_405B))
    assert "7 layers in 4 chunks of 1+2+2+2" in est.role(est.ranks[0])
    assert "7 layers in 4 chunks of 2+2+2+1" in est.role(est.ranks[-1])
