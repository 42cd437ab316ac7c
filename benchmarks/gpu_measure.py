"""Measure the three GPU counters of real training steps on CUDA, written as data/measured rows.

Each scenario of ``MEASUREMENTS`` is built from its HF config with random weights (nothing is downloaded),
trained for a few real steps (forward with labels, outputs dropped, backward, optimizer step,
``zero_grad(set_to_none=True)``) in a subprocess of its own, so every reading starts from a fresh CUDA
context; then ``torch.cuda.max_memory_allocated``, ``max_memory_reserved`` and the device's used memory
(``nvidia-smi`` for this process, else ``torch.cuda.mem_get_info``) become three rows of the
``data/measured`` format, which ``benchmarks/fidelity_measured.py`` compares with the engine.

Run on a machine with a CUDA GPU (about 5 minutes on one H100/H200, under 10 by design):
    python benchmarks/gpu_measure.py --out data/measured/gpu_h200.csv
    python benchmarks/gpu_measure.py --list            # the scenarios and their time budget (no GPU needed)
Without CUDA it exits at once with status 2 and says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_measured import COLUMNS, write_csv  # noqa: E402

from memsim_widget.catalog.models import architecture_for, resolve_model_config  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

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


def budget_seconds(measurements: Iterable[Measurement] = MEASUREMENTS) -> int:
    """Seconds the run may take: the subprocess budgets plus 10 s of start-up each."""
    return sum(m.seconds + 10 for m in measurements)


def resolved(m: Measurement) -> dict[str, Any]:
    """The measurement's scenario with every key, as the engine reads it."""
    return Scenario.from_dict(m.scenario).to_dict()


# ----- rows ------------------------------------------------------------------------------------------------
COUNTER_SOURCES = {
    "allocated": "torch.cuda.max_memory_allocated()",
    "reserved": "torch.cuda.max_memory_reserved()",
    "nvidia-smi": "device used memory after the steps: nvidia-smi for this process (else mem_get_info)",
}


def rows_for(m: Measurement, reading: dict[str, Any], env: dict[str, str]) -> list[dict[str, str]]:
    """Three data/measured rows (allocated, reserved, nvidia-smi) for one measurement's reading."""
    sc = resolved(m)
    source = (
        f"benchmarks/gpu_measure.py on {env.get('device', '?')}, torch {env.get('torch', '?')}, "
        f"transformers {env.get('transformers', '?')}, {env.get('date', '?')}"
    )
    out = []
    for counter, key in (("allocated", "allocated"), ("reserved", "reserved"), ("nvidia-smi", "device")):
        nbytes = int(reading[key])
        row = dict.fromkeys(COLUMNS, "")
        row.update(
            id=f"g-{m.name}-{counter}",
            source=source,
            model=sc["model"] if isinstance(sc["model"], str) else json.dumps(sc["model"]),
            method=sc["method"],
            precision=sc["precision"],
            optimizer=f"{sc['optimizer']} ({sc['optimizer_impl']})",
            micro_batch=str(sc["micro_batch_size"]),
            seq_len=str(sc["seq_len"]),
            grad_accum=str(sc["grad_accum_steps"]),
            activation_checkpointing=sc["activation_checkpointing"],
            attention=sc["attention"],
            parallelism="single",
            num_gpus="1",
            gpu=env.get("device", ""),
            measured_peak_gb=f"{nbytes / GiB:.4f}",
            what_measured=COUNTER_SOURCES[counter],
            notes=m.note + (f"; step lengths {list(m.step_lengths())}" if m.lengths else ""),
            unit="GiB",
            peak_gib=f"{nbytes / GiB:.4f}",
            trust="high",
            measured_bytes=str(nbytes),
            counter=counter,
            framework=sc["framework"],
            reproducible="true",
            scenario_json=json.dumps(sc, sort_keys=True, separators=(",", ":")),
        )
        out.append(row)
    return out


# ----- one measurement, in a child process ---------------------------------------------------------------------
def _device_used_bytes(torch: Any) -> int:
    """This process's used device memory per nvidia-smi, else the device's used memory (total - free)."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        for line in text.splitlines():
            pid, used = (x.strip() for x in line.split(","))
            if int(pid) == os.getpid():
                return int(used) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def train_steps(m: Measurement, device: str = "cuda") -> None:
    """Build the measurement's model from its config and run its training steps on ``device``."""
    import torch
    import transformers

    sc = Scenario.from_dict(m.scenario)
    cfg_dict = dict(resolve_model_config(sc.model))
    torch.manual_seed(0)
    dev = torch.device(device)
    amp = sc.precision.startswith("amp-")
    wdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(
        sc.precision, torch.float32
    )
    arch = architecture_for(sc.model)
    attn = arch.attention_kernel("eager" if sc.attention == "eager" else "sdpa")  # Gemma 2 has no SDPA path
    config = transformers.AutoConfig.for_model(**cfg_dict)
    from memsim_widget.trace.hf import _family  # the trace's own choice of head and inputs per model type

    family = _family(cfg_dict["model_type"])
    vision, seq2seq = family == "vit", family == "seq2seq"
    cls = {
        "vit": transformers.AutoModelForImageClassification,
        "bert": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
    }.get(family, transformers.AutoModelForCausalLM)
    with dev:  # random init on the device itself: an 8B model initialised on the host takes minutes
        model = cls.from_config(config, attn_implementation=attn, dtype=wdtype)
    model.to(dev)
    if sc.activation_checkpointing == "full":
        model.gradient_checkpointing_enable()
    if sc.method == "lora":
        import peft

        lcfg = peft.LoraConfig(r=sc.lora.rank, lora_alpha=sc.lora.alpha, target_modules=list(sc.lora.targets))
        model = peft.get_peft_model(model, lcfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}
    opt = torch.optim.AdamW(params, lr=1e-5, **impl[sc.optimizer_impl])
    step_fn = torch.compile(model) if sc.compile else model
    vocab = getattr(config, "vocab_size", 0) or 0
    b = sc.micro_batch_size
    keep = sc.output_lifetime or "trainer"
    half = torch.bfloat16 if sc.precision == "amp-bf16" else torch.float16
    for length in m.step_lengths():
        if vision:
            size = cfg_dict.get("image_size", 224)
            inputs = {
                "pixel_values": torch.randn(b, 3, size, size, device=dev, dtype=wdtype),
                "labels": torch.randint(0, config.num_labels, (b,), device=dev),
            }
        else:
            ids = torch.randint(0, vocab, (b, length), device=dev)
            labels = torch.randint(0, vocab, (b, length), device=dev) if seq2seq else ids
            inputs = {"input_ids": ids, "labels": labels}  # a seq2seq decoder as long as the encoder
        with torch.autocast(dev.type, dtype=half, enabled=amp):
            out = step_fn(**inputs)
        loss = out.loss
        if keep == "trainer":  # HF Trainer drops the outputs before backward
            del out
        del inputs
        loss.backward()
        if keep == "backward":
            del out
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        if keep == "step":  # a plain for-loop rebinds `out` only at the next forward
            del out


def run_one(m: Measurement) -> dict[str, Any]:
    """Train the measurement's scenario for a few steps on CUDA and read the three counters."""
    import torch

    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    train_steps(m, "cuda")
    torch.cuda.synchronize()
    return {
        "allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.max_memory_reserved(),
        "device": _device_used_bytes(torch),
    }


def environment() -> dict[str, str]:
    """Device, library versions and date for the rows' source column."""
    import torch
    import transformers

    return {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": dt.date.today().isoformat(),
    }


def require_cuda() -> str | None:
    """None when PyTorch sees a CUDA device, else the reason this script cannot run here."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed; this script measures real GPU memory and needs PyTorch with CUDA"
    if not torch.cuda.is_available():
        return (
            "no CUDA device: this script measures real GPU memory (max_memory_allocated/reserved, nvidia-smi) "
            "and must run on a machine with a CUDA GPU; use --list to see its scenarios"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """Run every measurement (each in a subprocess) and write the rows."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "data" / "measured" / "gpu_measured.csv"))
    ap.add_argument("--only", nargs="*", help="names of the measurements to run")
    ap.add_argument(
        "--group", default="core", help="which group to run (core, families); each fits the budget"
    )
    ap.add_argument("--list", action="store_true", help="list the measurements and their time budget")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    chosen = [m for m in MEASUREMENTS if (m.name in args.only if args.only else m.group == args.group)]
    if args.list:
        for m in chosen:
            print(f"{m.name:<24} {m.seconds:>4} s  {json.dumps(m.scenario)}")
        print(f"budget {budget_seconds(chosen)} s (limit {BUDGET_SECONDS} s)")
        return 0
    reason = require_cuda()
    if reason:
        print(f"gpu_measure: {reason}", file=sys.stderr)
        return 2
    if args.child:
        (m,) = [x for x in MEASUREMENTS if x.name == args.child]
        print(json.dumps(run_one(m)))
        return 0
    env, rows, start = environment(), [], time.monotonic()
    for m in chosen:
        left = BUDGET_SECONDS - (time.monotonic() - start)
        if left < m.seconds:
            print(f"{m.name}: skipped, {left:.0f} s left of the budget", flush=True)
            continue
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", m.name],
                capture_output=True,
                text=True,
                timeout=min(left, m.seconds * 3),
                cwd=ROOT,
            )
        except subprocess.TimeoutExpired:
            print(f"{m.name}: timed out", flush=True)
            continue
        if proc.returncode:
            print(f"{m.name}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        reading = json.loads(proc.stdout.strip().splitlines()[-1])
        rows += rows_for(m, reading, env)
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
