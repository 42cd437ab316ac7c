"""Measure the three GPU counters of real training steps on CUDA, written as data/measured rows.

Each scenario of ``MEASUREMENTS`` is measured by ``memsim_widget.measure`` (the code path of ``memsim measure``:
random weights from the HF config, a few real steps, the three counters) in a subprocess of its own, so every
reading starts from a fresh CUDA context; the readings become three rows each of the ``data/measured`` format,
which ``benchmarks/fidelity_measured.py`` compares with the engine.

Run on a machine with a CUDA GPU (about 5 minutes on one H100/H200, under 10 by design):
    python benchmarks/gpu_measure.py --out data/measured/gpu_h200.csv
    python benchmarks/gpu_measure.py --list            # the scenarios and their time budget (no GPU needed)
    python benchmarks/gpu_measure.py --alloc-conf expandable_segments:True --out data/measured/gpu_h100_exp.csv
        # the same scenarios under another PYTORCH_CUDA_ALLOC_CONF (set in each subprocess's environment): the
        # rows' ids carry a tag (``g-<name>-expandable-<counter>``) and their scenario the setting as
        # ``allocator_conf``, so benchmarks/fidelity_measured.py compares them with the engine's mode for it
        # (UNTESTED ON GPU, issue 22 item 5b)
    python benchmarks/gpu_measure.py --cpu-smoke --out /tmp/x.csv   # the loop on CPU: tiny model, zero counters
Without CUDA (and without --cpu-smoke) it exits at once with status 2 and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memsim_widget import measure
from memsim_widget.alloc_conf import parse_alloc_conf
from memsim_widget.catalog.models import resolve_model_config
from memsim_widget.errors import ScenarioError
from memsim_widget.measure import write_csv
from memsim_widget.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
#: The whole run must end inside ten minutes, startup included.
BUDGET_SECONDS = 570
GiB = 2**30


@dataclass(frozen=True)
class Measurement:
    """One scenario to run: its engine scenario, how many steps, batch lengths, and a time budget."""

    name: str
    scenario: dict[str, Any]
    steps: int = 3
    seconds: int = 11  # budget for the subprocess: CUDA init, model build, the steps (3x is its timeout)
    note: str = ""
    lengths: tuple[int, ...] = field(
        default=()
    )  # per-step sequence lengths (padding "longest"); else seq_len
    group: str = "core"  # each group is one run of at most BUDGET_SECONDS (--group)

    def step_lengths(self) -> list[int]:
        """The sequence length of every step (the longest is the scenario's seq_len)."""
        return list(self.lengths) if self.lengths else [int(self.scenario.get("seq_len", 2048))] * self.steps


_LLAMA1B = {"model": "llama-3.2-1b", "gpu": "h200", "micro_batch_size": 4, "seq_len": 1024}
_QWEN = {"model": "qwen2.5-0.5b", "gpu": "h200", "micro_batch_size": 4, "seq_len": 2048}
_GPT2M_AMP = {
    "model": "gpt2-medium",
    "gpu": "h200",
    "precision": "amp-bf16",
    "attention": "eager",
    "micro_batch_size": 8,
    "seq_len": 1024,
}
_GPT2M_NODROP = {
    **resolve_model_config("gpt2-medium"),
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
}
#: Variable-length batches, longest 2048: what ``padding: "longest"`` describes.
_VARIABLE = (512, 2048, 1280, 768, 1792, 1024, 1536, 2048)

MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement("llama1b-bf16", _LLAMA1B, note="pure bf16, foreach AdamW"),
    Measurement("llama1b-bf16-fused", {**_LLAMA1B, "optimizer_impl": "fused"}),
    Measurement("llama1b-bf16-ckpt", {**_LLAMA1B, "activation_checkpointing": "full"}),
    Measurement("llama1b-bf16-eager", {**_LLAMA1B, "attention": "eager", "seq_len": 512}),
    Measurement("llama1b-amp", {**_LLAMA1B, "precision": "amp-bf16", "micro_batch_size": 2}),
    Measurement("llama1b-fp32", {**_LLAMA1B, "precision": "fp32", "micro_batch_size": 2, "seq_len": 512}),
    Measurement(
        "llama1b-lora",
        {**_LLAMA1B, "method": "lora", "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]}},
        note="peft, fp32 adapters on a bf16 base",
    ),
    Measurement("qwen05b-bf16", _QWEN, note="152k vocabulary: the loss buffers dominate"),
    Measurement(
        "qwen05b-bf16-longest",
        {**_QWEN, "padding": "longest"},
        lengths=_VARIABLE,
        seconds=20,
        note="batch lengths vary per step (tests FRAGMENTATION_VARIABLE)",
    ),
    Measurement("gpt2m-amp-eager", _GPT2M_AMP, note="dropout on; CUDA autocast softmax in fp32"),
    Measurement(
        "gpt2m-amp-sdpa",
        {**_GPT2M_AMP, "attention": "sdpa"},
        note="dropout on; SDPA on CUDA regenerates its dropout mask in backward",
    ),
    Measurement(
        "gpt2m-amp-eager-nodrop",
        {**_GPT2M_AMP, "model": _GPT2M_NODROP},
        note="gpt2m-amp-eager with every dropout at 0: the dropout share of that run",
    ),
    Measurement(
        "llama1b-bf16-compile",
        {**_LLAMA1B, "compile": True},
        seconds=45,
        note="torch.compile: pairs with llama1b-bf16",
    ),
    Measurement(
        "llama1b-bf16-loop",
        {**_LLAMA1B, "output_lifetime": "step"},
        note="plain loop: outputs = model(**batch) kept through backward and the optimizer step",
    ),
    Measurement("qwen3-06b-bf16", {**_QWEN, "model": "qwen3-0.6b"}, note="per-head q/k RMSNorm"),
    Measurement("olmo2-1b-bf16", {**_LLAMA1B, "model": "olmo-2-1b"}, note="post-norms, q/k norm"),
    Measurement("phi15-bf16", {**_LLAMA1B, "model": "phi-1_5"}, note="parallel attention + MLP, LayerNorm"),
    Measurement(
        "llama8b-bf16-fused",
        {
            **_LLAMA1B,
            "model": "llama-3.1-8b",
            "micro_batch_size": 1,
            "seq_len": 2048,
            "optimizer_impl": "fused",
        },
        seconds=30,
        note="full fine-tune of an 8B in pure bf16 on one card, fused AdamW",
    ),
    Measurement(
        "llama8b-lora",
        {
            **_LLAMA1B,
            "model": "llama-3.1-8b",
            "micro_batch_size": 2,
            "seq_len": 2048,
            "method": "lora",
            "lora": {"rank": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        },
        seconds=30,
        note="peft, fp32 adapters on a bf16 base",
    ),
    Measurement(
        "vitb-amp",
        {"model": "vit-base-patch16-224", "gpu": "h200", "precision": "amp-bf16", "micro_batch_size": 64},
    ),
    Measurement(
        "vitb-amp-compile",
        {
            "model": "vit-base-patch16-224",
            "gpu": "h200",
            "precision": "amp-bf16",
            "micro_batch_size": 64,
            "compile": True,
        },
        seconds=45,
        note="torch.compile: pairs with vitb-amp",
    ),  # fmt: skip
)


FAMILIES = (  # the most telling first: a run cut short keeps what it measured
    Measurement(
        "t5-base-bf16",
        {"model": "t5-base", "gpu": "h200", "micro_batch_size": 8, "seq_len": 512},
        group="families",
        note="encoder-decoder, decoder as long as the encoder; dropout 0.1 as published",
    ),
    Measurement(
        "gemma2-2b-bf16-default",
        {**_LLAMA1B, "model": "gemma-2-2b", "micro_batch_size": 2},
        group="families",
        note="attention left at the default: transformers runs Gemma 2 eager (softcapping)",
    ),
    Measurement("gemma3-1b-bf16", {**_LLAMA1B, "model": "gemma-3-1b"}, group="families"),
    Measurement(
        "roberta-base-amp",
        {
            "model": "roberta-base",
            "gpu": "h200",
            "precision": "amp-bf16",
            "micro_batch_size": 32,
            "seq_len": 512,
        },
        group="families",
        note="published dropout 0.1, SDPA: CUDA's fused kernels keep no attention mask",
    ),
    Measurement(
        "modernbert-base-bf16",
        {"model": "modernbert-base", "gpu": "h200", "micro_batch_size": 16, "seq_len": 1024},
        group="families",
    ),
    Measurement(
        "gpt-oss-20b-lora",
        {
            "model": "gpt-oss-20b",
            "gpu": "h200",
            "attention": "eager",
            "micro_batch_size": 1,
            "seq_len": 1024,
            "method": "lora",
            "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]},
        },
        seconds=60,
        group="families",
        note="bf16 (the MXFP4 experts dequantised), eager attention with sinks",
    ),
)
MEASUREMENTS = MEASUREMENTS + FAMILIES


#: ``--cpu-smoke``: a tiny model in place of each chosen measurement's, on CPU (the counters read 0).
SMOKE_MODEL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip


def smoke(m: Measurement) -> Measurement:
    """``m`` with the tiny model and short sequences (``--cpu-smoke``)."""
    sc = {**m.scenario, "model": SMOKE_MODEL, "seq_len": 64, "compile": False}
    return replace(m, scenario=sc, lengths=tuple(min(64, n) for n in m.lengths[:3]) if m.lengths else ())


def conf_tag(conf: str) -> str:
    """The id tag of rows measured under the allocator setting ``conf`` ('' for the default)."""
    if not conf:
        return ""
    if conf.replace(" ", "") == "expandable_segments:True":
        return "expandable"
    return re.sub(r"[^a-z0-9]+", "-", conf.lower()).strip("-")


def under_conf(m: Measurement, conf: str) -> Measurement:
    """``m`` measured under PYTORCH_CUDA_ALLOC_CONF=``conf``: tagged name and note, ``allocator_conf`` set."""
    if not conf:
        return m
    return replace(m, name=f"{m.name}-{conf_tag(conf)}", scenario={**m.scenario, "allocator_conf": conf},
                   note=f"{m.note}; PYTORCH_CUDA_ALLOC_CONF={conf}".lstrip("; "))  # fmt: skip


def budget_seconds(measurements: Iterable[Measurement] = MEASUREMENTS) -> int:
    """Seconds the run may take: the subprocess budgets plus 10 s of start-up each."""
    return sum(m.seconds + 10 for m in measurements)


def resolved(m: Measurement) -> dict[str, Any]:
    """The measurement's scenario with every key, as the engine reads it."""
    return Scenario.from_dict(m.scenario).to_dict()


# ----- one measurement: memsim_widget/measure.py (the code path of `memsim measure`) --------------------------
def rows_for(m: Measurement, reading: dict[str, Any], env: dict[str, str]) -> list[dict[str, str]]:
    """Three data/measured rows (allocated, reserved, nvidia-smi) for one measurement's reading."""
    note = m.note + (f"; step lengths {list(m.step_lengths())}" if m.lengths else "")
    return measure.rows_for(m.name, Scenario.from_dict(m.scenario), reading, env, tool="benchmarks/gpu_measure.py",
                            note=note)  # fmt: skip


def train_steps(m: Measurement, device: str = "cuda") -> None:
    """Build the measurement's model from its config and run its training steps on ``device``."""
    measure.train_steps(Scenario.from_dict(m.scenario), m.step_lengths(), device)


def run_one(m: Measurement, cpu_smoke: bool = False) -> dict[str, Any]:
    """Train the measurement's scenario for a few steps on CUDA and read the three counters (with the allocator
    setting the subprocess saw). ``cpu_smoke``: the steps on CPU, the counters 0."""
    seen = {"alloc_conf_env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    if cpu_smoke:
        measure.train_steps(Scenario.from_dict(m.scenario), m.step_lengths(), "cpu")
        return {"allocated": 0, "reserved": 0, "device": 0, **seen}
    reading = measure.run(Scenario.from_dict(m.scenario), m.step_lengths(), history=False)
    return {**{k: reading[k] for k in ("allocated", "reserved", "device")}, **seen}


environment = measure.environment
require_cuda = measure.require_cuda


def on_local_card(m: Measurement) -> Measurement:
    """``m`` with its scenario on the card it ran on (the scenarios name the H200; an H100 run is an H100's row)."""
    gpu = measure.local_gpu(Scenario.from_dict(m.scenario)).gpu
    return replace(m, scenario={**m.scenario, "gpu": gpu if isinstance(gpu, str) else dict(gpu)})


def child_args(args: argparse.Namespace) -> list[str]:
    """The options a subprocess needs to find its (tagged, smoke) measurement among the chosen."""
    out = ["--alloc-conf", args.alloc_conf] if args.alloc_conf else []
    out += ["--only", *args.only] if args.only else ["--group", args.group]
    return out + (["--cpu-smoke"] if args.cpu_smoke else [])


def main(argv: list[str] | None = None) -> int:
    """Run every measurement (each in a subprocess) and write the rows."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "data" / "measured" / "gpu_measured.csv"))
    ap.add_argument("--only", nargs="*", help="names of the measurements to run")
    ap.add_argument(
        "--group", default="core", help="which group to run (core, families); each fits the budget"
    )
    ap.add_argument("--list", action="store_true", help="list the measurements and their time budget")
    ap.add_argument(
        "--alloc-conf", default="", help="PYTORCH_CUDA_ALLOC_CONF for every measurement (rows tagged)"
    )
    ap.add_argument("--budget", type=float, default=BUDGET_SECONDS, help="seconds for the whole run")
    ap.add_argument("--cpu-smoke", action="store_true", help="the loop on CPU with a tiny model (counters 0)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.alloc_conf:
        try:
            parse_alloc_conf(args.alloc_conf, "--alloc-conf")
        except ScenarioError as e:
            print(f"gpu_measure: {e}", file=sys.stderr)
            return 2
    chosen = [m for m in MEASUREMENTS if (m.name in args.only if args.only else m.group == args.group)]
    if args.only:  # in the order given: a run cut short by its budget keeps the first ones
        chosen.sort(key=lambda m: args.only.index(m.name))
    if args.cpu_smoke:
        chosen = [smoke(m) for m in chosen]
    chosen = [under_conf(m, args.alloc_conf) for m in chosen]
    if args.list:
        for m in chosen:
            print(f"{m.name:<24} {m.seconds:>4} s  {json.dumps(m.scenario)}")
        print(f"budget {budget_seconds(chosen)} s (limit {BUDGET_SECONDS} s)")
        return 0
    reason = None if args.cpu_smoke else require_cuda()
    if reason:
        print(f"gpu_measure: {reason}", file=sys.stderr)
        return 2
    if args.child:
        (m,) = [x for x in chosen if x.name == args.child]
        print(json.dumps(run_one(m, args.cpu_smoke)))
        return 0
    env, rows, start = environment(), [], time.monotonic()
    child_env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": args.alloc_conf} if args.alloc_conf else None
    for m in chosen:
        left = args.budget - (time.monotonic() - start)
        if left < m.seconds:
            print(f"{m.name}: skipped, {left:.0f} s left of the budget", flush=True)
            continue
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", m.name, *child_args(args)],
                capture_output=True,
                text=True,
                timeout=min(left, m.seconds * 3),
                cwd=ROOT,
                env=child_env,
            )
        except subprocess.TimeoutExpired:
            print(f"{m.name}: timed out", flush=True)
            continue
        if proc.returncode:
            print(f"{m.name}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        reading = json.loads(proc.stdout.strip().splitlines()[-1])
        if reading["alloc_conf_env"] != args.alloc_conf:  # the rows would be tagged with a setting not used
            print(
                f"{m.name}: the subprocess saw PYTORCH_CUDA_ALLOC_CONF={reading['alloc_conf_env']!r}",
                flush=True,
            )
            continue
        rows += rows_for(m if args.cpu_smoke else on_local_card(m), reading, env)
        write_csv(rows, Path(args.out))  # after each one: a run cut short keeps what it measured
        print(
            f"{m.name:<24} allocated {reading['allocated'] / GiB:7.2f} reserved {reading['reserved'] / GiB:7.2f} "
            f"device {reading['device'] / GiB:7.2f} GiB  ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )
    write_csv(rows, Path(args.out))
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
