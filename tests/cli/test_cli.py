"""The memsim command line: JSON keys, overrides, stdin, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memsim_widget.cli import main
from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

REQUIRED = {
    "scenario",
    "model",
    "peak_tensor_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "device_total_bytes",
    "peak_phase",
    "components",
    "per_rank",
    "gpu_memory_bytes",
    "fits",
}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_has_the_contract_keys(capsys, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "llama-3.2-1b", "seq_len": 1024}))
    code, out, _ = run_cli(capsys, "estimate", str(path), "--json")
    assert code == 0
    data = json.loads(out)
    assert set(data) >= REQUIRED
    assert {"parameters", "trainable_parameters"} <= set(data["model"])
    assert data["scenario"]["seq_len"] == 1024 and data["scenario"]["precision"] == "bf16"
    est = estimate(Scenario.from_dict({"model": "llama-3.2-1b", "seq_len": 1024}))
    assert data["device_total_bytes"] == est.device_total_bytes
    assert data["gpu_memory_bytes"] == est.gpu.memory_bytes
    assert sum(data["components"].values()) == data["device_total_bytes"]


def test_flags_override_the_file(capsys, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "gpt2", "seq_len": 256, "gpu": "a100-80gb"}))
    code, out, _ = run_cli(
        capsys,
        "estimate",
        str(path),
        "--json",
        "--model",
        "qwen2.5-0.5b",
        "--seq-len",
        "512",
        "--micro-batch-size",
        "4",
        "--gpu",
        "rtx-4090",
        "--dp",
        "2",
        "--zero",
        "2",
    )
    assert code == 0
    sc = json.loads(out)["scenario"]
    assert (sc["model"], sc["seq_len"], sc["micro_batch_size"], sc["gpu"]) == (
        "qwen2.5-0.5b",
        512,
        4,
        "rtx-4090",
    )
    assert sc["parallel"]["dp"] == 2 and sc["parallel"]["zero"] == 2 and sc["num_gpus"] == 2


def test_stdin_and_table_output():
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "estimate", "-"],
        input='{"model": "llama-3.1-8b"}',
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "allocated" in proc.stdout and "verdict" in proc.stdout and "optimizer_states" in proc.stdout


def test_presets_and_gpus_list(capsys):
    code, out, _ = run_cli(capsys, "presets", "--json")
    ids = [p["id"] for p in json.loads(out)]
    assert code == 0 and len(ids) >= 25 and "llama-3.1-405b" in ids
    code, out, _ = run_cli(capsys, "gpus")
    assert code == 0 and "h100-sxm-80gb" in out and "rtx-4090" in out


@pytest.mark.parametrize(
    ("argv", "stdin", "field"),
    [
        (["estimate", "--model", "lama-3.1-8b"], None, "llama-3.1-8b"),
        (["estimate", "--tp", "3"], None, "parallel.tp"),
        (["estimate", "--model", "llama-2-7b", "--pp", "5"], None, "parallel.pp"),
        (["estimate", "--seq-len", "-4"], None, "seq_len"),
        (["estimate", "-"], '{"model": "gpt2",', "malformed JSON"),
        (["estimate", "-"], '{"modle": "gpt2"}', "modle"),
        (["estimate", "-"], '{"num_gpus": 4, "parallel": {"dp": 2}}', "num_gpus"),
        (["estimate", "--precision", "int3"], None, "precision"),
        (["estimate", "--micro-batch-size", "x"], None, "micro-batch-size"),
        (
            ["estimate", "--compile", "true", "--activation-memory-budget", "2"],
            None,
            "activation_memory_budget",
        ),
        (["estimate", "--activation-memory-budget", "0.5"], None, "activation_memory_budget"),
        (["estimate", "/no/such/file.json"], None, "cannot read"),
        (["frobnicate"], None, "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, stdin, field):
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", *argv],
        input=stdin or "",
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert field in lines[0] and "Traceback" not in proc.stderr


def test_compile_is_labelled_as_unmodelled_in_text_json_and_estimate(capsys, tmp_path):
    """compile: true outside the traced decoders under SDPA is an untraced formula: the output says so instead of
    looking as exact as the rest; where the traced rule applies it says what it is."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "llama-3.2-1b", "compile": True, "attention": "eager"}))
    assert main(["estimate", str(path)]) == 0
    assert "caveat    compile: untraced for this scenario, a formula" in capsys.readouterr().out
    covered = tmp_path / "c.json"
    covered.write_text(json.dumps({"model": "llama-3.2-1b", "compile": True}))
    assert main(["estimate", str(covered)]) == 0
    assert "caveat    compile: Inductor's partitioner's saved tensors" in capsys.readouterr().out
    assert main(["estimate", str(path), "--json"]) == 0
    assert any("compile" in c for c in json.loads(capsys.readouterr().out)["caveats"])
    # the flags carry compile and its partitioner budget
    assert main(["estimate", "--model", "llama-3.2-1b", "--compile", "true", "--activation-memory-budget", "0.5",
                 "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert any(c.startswith("activation_memory_budget 0.5: untraced") for c in out["caveats"])
    assert estimate(Scenario.from_dict({"model": "llama-3.2-1b"})).caveats == ()


#: What ``memsim estimate`` must not import (issue 28: its start costs under 40 ms beyond numpy and pandas,
#: ``benchmarks/cli_startup.py``): the other commands' libraries (subprocess and csv serve ``measure``, difflib an
#: error's suggestion, importlib.resources' zipfile and tempfile nothing a preset needs), numpy and pandas (an
#: estimate computes in plain Python), and the layers above the engine.
NOT_ON_THE_ESTIMATE_PATH = (
    "subprocess", "csv", "difflib", "zipfile", "tempfile", "importlib.resources", "numpy", "pandas",
    "memsim_widget.plan", "memsim_widget.charts", "memsim_widget.widget", "memsim_widget.trace",
    "memsim_widget.export.common", "memsim_widget.importers",
)  # fmt: skip


def test_an_estimate_imports_only_what_it_needs():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['memsim', 'estimate', '--model', 'llama-3.1-8b']\n"
        "try:\n"
        "    runpy.run_module('memsim_widget.cli', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {NOT_ON_THE_ESTIMATE_PATH!r} if m in sys.modules), file=sys.stderr)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "peak" in run.stdout, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == "[]"
