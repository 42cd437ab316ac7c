"""`memsim trace`: the same step on fake tensors, with the estimate's keys; a clear exit 2 without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import TINY_LLAMA

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_trace_json_has_the_estimate_keys_and_agrees_with_the_engine(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": TINY_LLAMA, "micro_batch_size": 2, "seq_len": 128}))
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "trace", str(path), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in ("scenario", "model", "peak_tensor_bytes", "peak_phase", "components", "timeline", "top"):
        assert key in data
    assert data["model"]["parameters"] > 0
    assert sum(data["components"].values()) == data["peak_tensor_bytes"]
    sim = data["simulated"]["peak_tensor_bytes"]
    assert abs(sim - data["peak_tensor_bytes"]) / data["peak_tensor_bytes"] < 0.03
    assert len(data["timeline"]) > 10 and data["top"][0]["bytes"] >= data["top"][-1]["bytes"]


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--method", "qlora"], "method"),
        (["--dp", "2", "--zero", "2"], "parallel.zero"),
        (["--optimizer", "lion"], "optimizer"),
    ],
)
def test_untraceable_scenarios_exit_2_naming_the_field(flags, field):
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "trace", *flags],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and field in proc.stderr


def test_without_torch_it_says_which_extra_to_install():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from memsim_widget.cli import main\n"
        "sys.exit(main(['trace', '--model', 'gpt2']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "memsim-widget[trace]" in proc.stderr and "Traceback" not in proc.stderr


def test_trace_a_user_module_from_a_file(tmp_path):
    user = tmp_path / "mine.py"
    user.write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a = torch.nn.Linear(256, 1024)\n"
        "        self.b = torch.nn.Linear(1024, 256)\n"
        "    def forward(self, x):\n"
        "        return self.b(torch.relu(self.a(x))).pow(2).mean()\n"
        "def inputs():\n"
        "    return (torch.randn(32, 256),)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memsim_widget.cli",
            "trace",
            "--precision",
            "fp32",
            "--module",
            f"{user}:Net",
            "--inputs",
            f"{user}:inputs",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    n = 256 * 1024 + 1024 + 1024 * 256 + 256
    assert data["model"]["parameters"] == n
    assert data["components"]["parameters"] == 4 * n and data["components"]["optimizer_states"] >= 8 * n


def test_a_bad_module_spec_is_one_line():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memsim_widget.cli",
            "trace",
            "--module",
            "nope.py:Net",
            "--inputs",
            "nope.py:x",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "--module" in proc.stderr and "Traceback" not in proc.stderr


def test_a_rank_outside_the_job_exits_2_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "trace", "--dp", "8", "--zero", "3", "--rank", "9"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("memsim: error: rank: ") and "0..7" in proc.stderr


def test_a_multi_gpu_trace_names_the_traced_rank_and_its_role(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": TINY_LLAMA, "micro_batch_size": 1, "seq_len": 128}))
    flags = ["--dp", "2", "--zero", "3", "--rank", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "trace", str(path), *flags],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        "rank      rank 1 of 2: FSDP shard 1 of 2, pipeline stage 0 of 1 (embeddings .. head)"
    )
