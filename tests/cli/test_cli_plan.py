"""``memsim plan`` and ``memsim recommend``: what they print is checked by estimating it again.

Every candidate ``plan --json`` prints carries its full scenario; estimating that scenario must give the
printed bytes and fit with the headroom. Every change ``recommend`` prints must fit when estimated. Bad
input exits with status 2 and one line naming the field; nothing fitting is an answer (status 0).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from typing import Any

import pytest
from _cli_run import run  # noqa: E402

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

PLAN_70B = ["plan", "--model", "llama-3.1-70b", "--gpu", "h100-sxm-80gb", "--gpus", "64", "--seq-len", "8192"]
PLAN_QLORA = ["plan", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--gpus", "1", "--method", "qlora",
              "--seq-len", "2048"]  # fmt: skip
#: A full fine-tune of an 8B model on one 40 GB card: does not fit as it is.
TOO_BIG = {"model": "llama-3.1-8b", "gpu": "a100-40gb", "seq_len": 4096}
#: A 1B model with 8 sequences per micro-batch on a 24 GB card: fixable without changing the job.
FIXABLE = {"model": "llama-3.2-1b", "gpu": "rtx-4090", "micro_batch_size": 8, "seq_len": 4096}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None) -> dict[str, Any]:
    code, out, err = run(capsys, *argv, "--json", stdin=stdin)
    assert code == 0, err
    return json.loads(out)


def fits(device_total_bytes: int, gpu_memory_bytes: int, headroom: float) -> bool:
    return device_total_bytes <= gpu_memory_bytes * (1 - headroom)


def check_candidates(data: dict[str, Any]) -> list[Scenario]:
    """Every printed candidate, estimated again: same bytes, fits with the headroom, ranked by the proxy."""
    cands = data["candidates"]
    assert cands and [c["rank"] for c in cands] == list(range(1, len(cands) + 1))
    speeds = [c["throughput"]["tokens_per_gpu_s"] for c in cands]
    assert speeds == sorted(speeds, reverse=True)
    scenarios = []
    for c in cands:
        sc = Scenario.from_dict(c["scenario"])
        est = estimate(sc)
        assert est.device_total_bytes == c["estimate"]["device_total_bytes"]
        assert est.peak_allocated_bytes == c["estimate"]["peak_allocated_bytes"]
        assert fits(est.device_total_bytes, est.gpu.memory_bytes, data["headroom"])
        assert c["estimate"]["fits"] is True
        scenarios.append(sc)
    return scenarios


# ----- memsim plan ---------------------------------------------------------------------------------------


def test_plan_70b_on_64_h100(capsys):
    data = run_json(capsys, *PLAN_70B)
    assert data["gpu_counts"] == [64] and data["headroom"] == 0.10
    assert data["fitting"] >= len(data["candidates"]) == 20  # --top defaults to 20
    for sc in check_candidates(data):
        d = sc.to_dict()
        assert (d["model"], d["gpu"], d["seq_len"], d["num_gpus"]) == (
            "llama-3.1-70b",
            "h100-sxm-80gb",
            8192,
            64,
        )


def test_plan_qlora_on_one_4090(capsys):
    data = run_json(capsys, *PLAN_QLORA)
    for sc in check_candidates(data):
        assert sc.method == "qlora" and sc.parallel.world_size == 1 and sc.gpu == "rtx-4090"
        assert sc.seq_len == 2048


def test_gpu_ranges_lists_top_and_headroom(capsys):
    base = ["plan", "--model", "qwen2.5-0.5b", "--gpu", "rtx-4090", "--seq-len", "1024"]
    # the counts and headroom are read whatever knobs are searched: a narrow space
    base += ["--micro-batch", "1,4", "--zero", "0,3", "--pp", "1", "--cp", "1", "--checkpointing", "none"]
    assert run_json(capsys, *base, "--gpus", "3-16", "--top", "1")["gpu_counts"] == [3, 4, 8, 16]
    data = run_json(capsys, *base, "--gpus", "6,2", "--top", "4", "--headroom", "0.3")
    assert data["gpu_counts"] == [2, 6] and data["headroom"] == 0.3 and len(data["candidates"]) == 4
    for sc in check_candidates(data):
        assert sc.parallel.world_size in (2, 6)


def test_flags_narrow_the_search(capsys):
    data = run_json(
        capsys,
        *["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--gpus", "8", "--seq-len", "4096"],
        *["--zero", "3", "--checkpointing", "full,selective", "--micro-batch", "1,2", "--optimizer", "adamw"],
        *["--tp", "1,2", "--pp", "1", "--cp", "1", "--loss", "standard", "--sequence-parallel", "false"],
        "--top",
        "50",
    )
    for sc in check_candidates(data):
        p = sc.parallel
        assert p.zero == 3 and sc.activation_checkpointing in ("full", "selective")
        assert sc.micro_batch_size in (1, 2) and sc.optimizer == "adamw" and sc.loss == "standard"
        assert p.tp in (1, 2) and p.pp == 1 and p.cp == 1 and not p.sequence_parallel


def test_the_global_batch_is_kept(capsys):
    tokens = 64 * 4096
    data = run_json(
        capsys,
        *["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--seq-len", "4096"],
        *["--global-batch-tokens", str(tokens), "--top", "30"],
    )
    assert data["global_batch_tokens"] == tokens
    for sc in check_candidates(data):
        p = sc.parallel
        steps = p.pp_microbatches if p.pp > 1 else sc.grad_accum_steps
        assert p.dp * sc.micro_batch_size * steps * sc.seq_len == tokens


def test_a_scenario_file_gives_the_fixed_choices(capsys, tmp_path):
    path = tmp_path / "job.json"
    job = {"model": "llama-3.1-8b", "gpu": "rtx-4090", "method": "lora", "seq_len": 1024,
           "lora": {"rank": 64, "targets": ["all-linear"]}, "framework": "torchtune", "optimizer": "adamw"}  # fmt: skip
    path.write_text(json.dumps(job))
    for argv in ([str(path)], ["--base", str(path)]):
        data = run_json(capsys, "plan", *argv, "--gpus", "1-2", "--top", "10")
        for sc in check_candidates(data):
            assert sc.method == "lora" and sc.lora.rank == 64 and sc.framework == "torchtune"
            assert sc.optimizer == "adamw"  # a file that names its optimizer fixes it
    data = run_json(capsys, "plan", str(path), "--seq-len", "512", "--gpus", "1")  # flags override the file
    assert all(c["scenario"]["seq_len"] == 512 for c in data["candidates"])


def test_plan_reads_the_file_from_stdin(capsys):
    data = run_json(
        capsys, "plan", "-", "--gpus", "1", stdin=json.dumps({"model": "qwen2.5-0.5b", "gpu": "l4"})
    )
    for sc in check_candidates(data):
        assert sc.model == "qwen2.5-0.5b" and sc.gpu == "l4"


def test_several_methods_are_searched(capsys):
    data = run_json(
        capsys,
        *["plan", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--gpus", "1", "--method", "full,qlora"],
    )
    assert data["methods"] == ["full", "qlora"]
    assert {sc.method for sc in check_candidates(data)} <= {"full", "qlora"}


def test_plan_table(capsys):
    code, out, _ = run(capsys, *PLAN_QLORA, "--top", "5")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["#", "gpus", "dp"] and "GiB/GPU" in lines[0] and "tok/s/GPU" in lines[0]
    assert [ln.split()[0] for ln in lines[1:6]] == ["1", "2", "3", "4", "5"]
    assert " fit (" in lines[-1] and "; best:" in lines[-1] and "tokens/s/GPU (modelled)" in lines[-1]


def test_nothing_fits_is_an_answer_with_a_hint(capsys):
    argv = ["plan", "--model", "llama-3.1-70b", "--gpu", "rtx-4090", "--gpus", "1-2", "--seq-len", "4096",
            "--method", "full"]  # fmt: skip
    code, out, err = run(capsys, *argv)
    assert code == 0 and not err
    assert "added parameter offload" in out  # the search widened (a fixed method stays fixed)
    assert "0 fit" in out and "closest:" in out and "memsim recommend" in out
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0
    data = json.loads(out)  # stdout stays one JSON object; the hint goes to stderr
    assert data["fitting"] == 0 and data["candidates"] == [] and "memsim recommend" in err
    hint = err.strip().splitlines()[-1]
    cmd = shlex.split(hint[hint.index("memsim recommend") :])
    rec = run_json(capsys, *cmd[1:])  # the suggested command runs
    assert rec["scenario"]["model"] == "llama-3.1-70b" and rec["scenario"]["gpu"] == "rtx-4090"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--gpus", "0"], "gpus"),
        (["--gpus", "x"], "gpus"),
        (["--gpus", "8-2"], "gpus"),
        (["--gpus", "2,-1"], "gpus"),
        (["--model", "no-such-model"], "model"),
        (["--gpu", "h900"], "gpu"),
        (["--method", "foo"], "method"),
        (["--method", "full,foo"], "methods"),
        (["--headroom", "1.5"], "headroom"),
        (["--headroom", "-0.1"], "headroom"),
        (["--headroom", "abc"], "--headroom"),
        (["--seq-len", "-4"], "seq_len"),
        (["--zero", "7"], "space.zero"),
        (["--zero", "x"], "space.zero"),
        (["--checkpointing", "fast"], "space.checkpointing"),
        (["--optimizer", "adamw-9bit"], "space.optimizers"),
        (["--sequence-parallel", "maybe"], "space.sequence_parallel"),
        (["--max-tp", "0"], "space.max_tp"),
        (["--top", "0"], "top"),
        (["--global-batch-tokens", "5"], "global_batch_tokens"),
        (["/no/such/file.json"], "cannot read"),
        (["a.json", "--base", "b.json"], "--base"),
    ],
)
def test_bad_plan_input_exits_2_with_one_line(capsys, extra, field):
    code, out, err = run(capsys, "plan", "--model", "llama-3.1-8b", *extra)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memsim: error: ") and field in lines[0], err


# ----- memsim recommend ----------------------------------------------------------------------------------


def test_recommend_lists_changes_that_fit(capsys, tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(FIXABLE))
    data = run_json(capsys, "recommend", str(path))
    before = estimate(Scenario.from_dict(FIXABLE))
    assert data["fits"] is False and data["device_total_bytes"] == before.device_total_bytes
    assert data["recommendations"]
    jobs = [r["changes_the_job"] for r in data["recommendations"]]
    assert jobs == sorted(jobs) and not jobs[0]  # a fix that keeps the job first
    for r in data["recommendations"]:
        after = estimate(Scenario.from_dict(r["scenario"]))
        assert after.device_total_bytes == r["device_total_bytes_after"]
        assert fits(after.device_total_bytes, after.gpu.memory_bytes, data["headroom"])
        assert r["saved_bytes"] == before.device_total_bytes - after.device_total_bytes
    mb = data["max_micro_batch"]
    assert mb is None or mb < FIXABLE["micro_batch_size"]


def test_recommend_text(capsys, tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(TOO_BIG))
    code, out, _ = run(capsys, "recommend", str(path))
    assert code == 0
    assert "verdict   does not fit" in out
    for words in ("changes that fit", "saves", "cost:", "max micro-batch", "max sequence", "min GPUs"):
        assert words in out
    assert "[changes the job]" in out  # only LoRA/QLoRA make an 8B full fine-tune fit 40 GB


def test_recommend_on_a_fitting_scenario(capsys):
    sc = {"model": "llama-3.2-1b", "gpu": "a100-80gb"}
    data = run_json(capsys, "recommend", "-", stdin=json.dumps(sc))
    assert data["fits"] is True and data["recommendations"] == [] and data["levers"]
    assert data["max_micro_batch"] >= 1 and data["min_gpus"]["num_gpus"] == 1
    code, out, _ = run(capsys, "recommend", "-", stdin=json.dumps(sc))
    assert code == 0 and "verdict   fits" in out and "what each lever would save" in out


def test_recommend_flags_override_the_file_and_headroom_is_used(capsys, tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(TOO_BIG))
    data = run_json(capsys, "recommend", str(path), "--gpu", "h200", "--headroom", "0.2")
    assert data["scenario"]["gpu"] == "h200" and data["headroom"] == 0.2
    assert data["fits"] == fits(data["device_total_bytes"], data["gpu_memory_bytes"], 0.2)


@pytest.mark.parametrize(
    ("argv", "stdin", "field"),
    [
        (["recommend", "-", "--headroom", "1"], json.dumps(TOO_BIG), "headroom"),
        (["recommend", "-"], '{"model": "gpt2",', "malformed JSON"),
        (["recommend", "-"], '{"modle": "gpt2"}', "modle"),
        (["recommend", "--tp", "3"], None, "parallel.tp"),
        (["recommend", "/no/such/file.json"], None, "cannot read"),
    ],
)
def test_bad_recommend_input_exits_2_with_one_line(capsys, argv, stdin, field):
    code, out, err = run(capsys, *argv, stdin=stdin)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], err


def test_recommend_reads_stdin_in_a_real_process():
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "recommend", "-", "--json"],
        input=json.dumps(TOO_BIG),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["scenario"]["gpu"] == "a100-40gb" and data["fits"] is False
    for r in data["recommendations"]:
        assert estimate(Scenario.from_dict(r["scenario"])).fits(headroom=data["headroom"])
