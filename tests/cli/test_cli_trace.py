"""`memsim trace`: the same step on fake tensors, with the estimate's keys; a clear exit 2 without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import TINY_LLAMA

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.slow
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
        "sys.exit(main(['trace', '--model', 'gpt2', '--seq-len', '512']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "memsim-widget[trace]" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


#: A tiny Phi-3 with a longrope ``rope_scaling`` (short and long factors, one per rotary frequency pair).
PHI3_LONGROPE = {
    "model_type": "phi3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 100,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.5] * 8},
}


@pytest.mark.slow
def test_trace_of_phi3_longrope_runs(tmp_path):
    """Phi-3's longrope init multiplies a torch.tensor of its factors by computed frequencies: under fake mode
    on the meta device that mixed a plain meta tensor with a fake one and crashed; the model now builds."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": PHI3_LONGROPE, "micro_batch_size": 1, "seq_len": 32}))
    proc = subprocess.run(
        [sys.executable, "-m", "memsim_widget.cli", "trace", str(path), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    sim = data["simulated"]["peak_tensor_bytes"]
    assert abs(sim - data["peak_tensor_bytes"]) / data["peak_tensor_bytes"] < 0.03


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({**PHI3_LONGROPE, "model_type": "zamba2"}, "model.model_type"),
        (
            {
                "model_type": "falcon",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 7,
                "vocab_size": 100,
            },
            "model.num_attention_heads",
        ),  # fmt: skip
        (
            {
                "model_type": "falcon",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 100,
                "alibi": True,
                "attention_dropout": 0.1,
            },
            "model.attention_dropout",
        ),  # fmt: skip
    ],
)
def test_trace_refuses_what_the_engine_refuses_before_building_anything(tmp_path, model, field):
    """An unknown model type (or a config the engine does not model: Falcon ALiBi with attention dropout) is one
    line, exit 2, before torch is even imported: with torch made unimportable the error is the model's, not the
    missing extra's."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": model, "micro_batch_size": 1, "seq_len": 32}))
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from memsim_widget.cli import main\n"
        f"sys.exit(main(['trace', {str(path)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"memsim: error: {field}: "), proc.stderr
