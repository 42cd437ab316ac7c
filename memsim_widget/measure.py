"""Measure a scenario on the local CUDA GPU: real training steps with random weights, the three counters next to
memsim's prediction, the moment of the peak, and a row in the data/measured format.

One code path for ``memsim measure`` and ``benchmarks/gpu_measure.py``: the model is built from the scenario's
HF config with random weights on the device (nothing is downloaded), trained for a few real steps (forward with
labels, the outputs kept as the scenario's ``output_lifetime`` says, backward, optimizer step,
``zero_grad(set_to_none=True)``); then ``torch.cuda.max_memory_allocated``, ``max_memory_reserved`` and the
device's used memory (nvidia-smi for this process, else ``torch.cuda.mem_get_info``). The peak's moment is the
step and phase after which ``max_memory_allocated`` first reached its final value, and, where
``torch.cuda.memory._record_memory_history`` exists (a private PyTorch API), the source line of the allocation
that set it. Torch and transformers are imported only when a measurement runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsim_widget.errors import ScenarioError

if TYPE_CHECKING:  # imported on use: the CLI builds its parser from add_measure on every start
    from memsim_widget.scenario import Scenario

GiB = 2**30
STEPS = 3
#: The columns of every data/measured CSV: the source's own, then what the fidelity benchmark needs
#: (data/measured/README.md).
SOURCE_COLUMNS = [
    "id", "source", "model", "params_b", "method", "precision", "optimizer", "micro_batch", "seq_len",
    "grad_accum", "activation_checkpointing", "attention", "lora_rank", "lora_targets", "quant",
    "parallelism", "num_gpus", "gpu", "measured_peak_gb", "what_measured", "notes", "unit", "peak_gib", "trust",
]  # fmt: skip
COLUMNS = SOURCE_COLUMNS + [
    "measured_bytes", "counter", "framework", "reproducible", "reason", "assumptions", "scenario_json",
]  # fmt: skip
COUNTER_SOURCES = {
    "allocated": "torch.cuda.max_memory_allocated()",
    "reserved": "torch.cuda.max_memory_reserved()",
    "nvidia-smi": "device used memory after the steps: nvidia-smi for this process (else mem_get_info)",
}
#: Counter -> (key of a reading, the Estimate attribute that predicts it).
COUNTERS = {"allocated": ("allocated", "peak_allocated_bytes"), "reserved": ("reserved", "peak_reserved_bytes"),
            "nvidia-smi": ("device", "device_total_bytes")}  # fmt: skip


def require_cuda() -> str | None:
    """None when PyTorch sees a CUDA device, else the reason a measurement cannot run here (one line)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed; measuring needs PyTorch with CUDA and a CUDA GPU"
    if not torch.cuda.is_available():
        return ("no CUDA device: measuring runs real training steps on a CUDA GPU (max_memory_allocated/reserved, "
                "nvidia-smi); run memsim estimate here instead")  # fmt: skip
    return None


def check_measurable(sc: Scenario) -> None:
    """What one local GPU can run: a single-GPU SFT step of a full or LoRA fine-tune (named field otherwise)."""
    if sc.parallel.world_size != 1:
        raise ScenarioError("parallel", f"measure runs on one GPU; this layout has {sc.parallel.world_size}")
    if sc.method == "qlora":
        raise ScenarioError("method", "qlora needs bitsandbytes' 4-bit weights, which measure does not build; "
                            "measure 'lora' or 'full'")  # fmt: skip
    if sc.objective_name != "sft":
        raise ScenarioError("objective", f"measure runs SFT steps; {sc.objective_name} is not built")
    if sc.precision.startswith("mixed-") or sc.precision == "fp8":
        raise ScenarioError("precision", f"{sc.precision!r} is DeepSpeed's or TransformerEngine's; measure runs "
                            "plain PyTorch (bf16, fp16, fp32, amp-*)")  # fmt: skip
    if sc.fp8 is not None and (sc.fp8.framework != "torchao" or sc.method != "full"):
        raise ScenarioError("fp8_recipe", "measure runs torchao's float8 (tensorwise, rowwise) on full training "
                            "only; TransformerEngine's recipes need its own modules")  # fmt: skip


# ----- the model and the steps --------------------------------------------------------------------------------
def build_model(sc: Scenario, device: str = "cuda") -> tuple[Any, Any, str]:
    """The scenario's model with random weights on ``device`` (``meta`` builds shapes only) and its HF config,
    LoRA-wrapped by peft when the method is lora; and the model's family (the trace's choice of head)."""
    import torch
    import transformers

    from memsim_widget.catalog.models import architecture_for, resolve_model_config
    from memsim_widget.trace.hf import _family  # the trace's own choice of head and inputs per model type

    cfg_dict = dict(resolve_model_config(sc.model))
    wdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(
        sc.precision, torch.float32
    )
    attn = architecture_for(sc.model).attention_kernel("eager" if sc.attention == "eager" else "sdpa")
    config = transformers.AutoConfig.for_model(**cfg_dict)
    family = _family(cfg_dict["model_type"])
    cls = {
        "vit": transformers.AutoModelForImageClassification,
        "bert": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
    }.get(family, transformers.AutoModelForCausalLM)
    torch.manual_seed(0)
    with torch.device(
        device
    ):  # random init on the device itself: an 8B model initialised on the host takes minutes
        model = cls.from_config(config, attn_implementation=attn, dtype=wdtype)
    model.to(torch.device(device))  # any buffer a model creates on the host
    if (
        sc.fp8 is not None
    ):  # torchao's float8 Linears, the output layer left out (as the trace and torchtitan)
        from memsim_widget.trace.float8 import apply_float8

        apply_float8(model, sc.fp8.name, [])
    if sc.activation_checkpointing == "full":
        model.gradient_checkpointing_enable()
    if sc.method == "lora":
        import peft

        # peft annotates lora_alpha as int, but only divides it by r: memsim's alpha is a float
        alpha: Any = sc.lora.alpha
        lcfg = peft.LoraConfig(r=sc.lora.rank, lora_alpha=alpha, target_modules=list(sc.lora.targets))
        # PEFT upcasts 16-bit adapters to fp32 unless told not to (memsim's lora.adapter_dtype)
        model = peft.get_peft_model(model, lcfg, autocast_adapter_dtype=sc.lora.adapter_dtype == "fp32")
    model.train()
    return model, config, family


def train_steps(sc: Scenario, lengths: Sequence[int], device: str = "cuda",
                on_phase: Callable[[int, str], None] | None = None) -> None:  # fmt: skip
    """Train ``sc`` for one step per entry of ``lengths`` (each a batch's sequence length) on ``device``;
    ``on_phase(step, phase)`` is called after each forward, backward and optimizer step."""
    import torch

    from memsim_widget.engine.frameworks import grads_kept

    model, config, family = build_model(sc, device)
    dev = torch.device(device)
    params = [p for p in model.parameters() if p.requires_grad]
    impl: dict[str, dict[str, Any]] = {
        "foreach": {"foreach": True},
        "fused": {"fused": True},
        "for-loop": {"foreach": False},
    }
    opt = torch.optim.AdamW(params, lr=1e-5, **impl[sc.optimizer_impl])
    step_fn = torch.compile(model) if sc.compile else model
    vocab = getattr(config, "vocab_size", 0) or 0
    b, keep = sc.micro_batch_size, sc.output_lifetime or "trainer"
    amp = sc.precision.startswith("amp-")
    half = torch.bfloat16 if sc.precision == "amp-bf16" else torch.float16
    wdtype = next(model.parameters()).dtype
    mark = on_phase or (lambda step, phase: None)
    for step, length in enumerate(lengths, 1):
        if family == "vit":
            size = getattr(config, "image_size", 224)
            inputs = {"pixel_values": torch.randn(b, 3, size, size, device=dev, dtype=wdtype),
                      "labels": torch.randint(0, config.num_labels, (b,), device=dev)}  # fmt: skip
        else:
            ids = torch.randint(0, vocab, (b, length), device=dev)
            labels = torch.randint(0, vocab, (b, length), device=dev) if family == "seq2seq" else ids
            inputs = {"input_ids": ids, "labels": labels}  # a seq2seq decoder as long as the encoder
        with torch.autocast(dev.type, dtype=half, enabled=amp):
            out = step_fn(**inputs)
        loss = out.loss
        mark(step, "forward")
        if keep == "trainer":  # HF Trainer drops the outputs before backward
            del out
        del inputs
        loss.backward()
        mark(step, "backward")
        if keep == "backward":
            del out
        opt.step()
        opt.zero_grad(set_to_none=not grads_kept(sc))  # zero_grad "zeros": torch < 2.0's default
        mark(step, "optimizer step")
        del loss
        if keep == "step":  # a plain for-loop rebinds `out` only at the next forward
            del out


def device_used_bytes(torch: Any) -> int:
    """This process's used device memory per nvidia-smi, else the device's used memory (total - free)."""
    import subprocess  # here, not at the top: the CLI builds its parser from add_measure on every start

    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
        for line in text.splitlines():
            pid, used = (x.strip() for x in line.split(","))
            if int(pid) == os.getpid():
                return int(used) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def run(sc: Scenario, lengths: Sequence[int] | None = None, history: bool = True) -> dict[str, Any]:
    """Train ``sc`` on CUDA for ``lengths`` (default: three steps of seq_len) and read the counters and the peak's
    moment: ``{"allocated", "reserved", "device", "peak_at", "peak_frame"}``."""
    import gc

    import torch

    lengths = list(lengths) if lengths else [sc.seq_len] * STEPS
    torch.cuda.init()
    gc.collect()
    torch.cuda.empty_cache()  # a second measurement in one process starts from an empty cache too
    torch.cuda.reset_peak_memory_stats()
    marks: list[tuple[int, str, int]] = []
    recording = history and _start_history(torch)

    def on_phase(step: int, phase: str) -> None:
        torch.cuda.synchronize()
        marks.append((step, phase, torch.cuda.max_memory_allocated()))

    train_steps(sc, lengths, "cuda", on_phase)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    at = next((f"step {s}, {p}" for s, p, m in marks if m >= peak), "after the steps")
    frame = _peak_frame(torch) if recording else None
    return {"allocated": peak, "reserved": torch.cuda.max_memory_reserved(), "device": device_used_bytes(torch),
            "peak_at": at, "peak_frame": frame}  # fmt: skip


def _start_history(torch: Any) -> bool:
    """Start recording allocations (``torch.cuda.memory._record_memory_history``, private: may be absent)."""
    record = getattr(torch.cuda.memory, "_record_memory_history", None)
    if record is None:
        return False
    try:
        record(max_entries=200_000)
    except (RuntimeError, TypeError):
        return False
    return True


def _peak_frame(torch: Any) -> str | None:
    """The Python source line of the allocation that set the peak, replayed from the recorded trace."""
    try:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    except (RuntimeError, AttributeError, TypeError):
        return None
    return peak_frame_of(snap.get("device_traces", [[]])[0])


def peak_frame_of(events: Iterable[dict[str, Any]]) -> str | None:
    """Replay alloc / free_completed events; the first Python frame of the allocation at the running maximum."""
    live = best = 0
    where = None
    for e in events:
        action, size = e.get("action"), int(e.get("size", 0))
        if action == "alloc":
            live += size
            if live > best:
                best, where = live, e
        elif action == "free_completed":
            live -= size
    if where is None:
        return None
    for f in where.get("frames", []):
        name = str(f.get("filename", ""))
        if name.endswith(".py") and "/torch/" not in name:
            return f"{name}:{f.get('line')} {f.get('name')}"
    frames = where.get("frames", [])
    return f"{frames[0].get('filename')}:{frames[0].get('line')}" if frames else None


def environment() -> dict[str, str]:
    """Device, library versions and date."""
    import datetime as dt

    import torch
    import transformers

    from memsim_widget.version import __version__

    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "memsim": __version__,
        "cuda": str(torch.version.cuda),
        "date": dt.date.today().isoformat(),
    }


# ----- rows and the report -------------------------------------------------------------------------------------
def rows_for(name: str, sc: Scenario, reading: dict[str, Any], env: dict[str, str], *, tool: str,
             note: str = "") -> list[dict[str, str]]:  # fmt: skip
    """Three data/measured rows (allocated, reserved, nvidia-smi) of one measurement's reading."""
    d = sc.to_dict()
    source = (f"{tool} on {env.get('device', '?')}, torch {env.get('torch', '?')}, "
              f"transformers {env.get('transformers', '?')}, {env.get('date', '?')}")  # fmt: skip
    out = []
    for counter, (key, _) in COUNTERS.items():
        nbytes = int(reading[key])
        row = dict.fromkeys(COLUMNS, "")
        row.update(
            id=f"g-{name}-{counter}", source=source,
            model=d["model"] if isinstance(d["model"], str) else json.dumps(d["model"]),
            method=d["method"], precision=d["precision"], optimizer=f"{d['optimizer']} ({d['optimizer_impl']})",
            micro_batch=str(d["micro_batch_size"]), seq_len=str(d["seq_len"]), grad_accum=str(d["grad_accum_steps"]),
            activation_checkpointing=d["activation_checkpointing"], attention=d["attention"], parallelism="single",
            num_gpus="1", gpu=env.get("device", ""), measured_peak_gb=f"{nbytes / GiB:.4f}",
            what_measured=COUNTER_SOURCES[counter], notes=note, unit="GiB", peak_gib=f"{nbytes / GiB:.4f}",
            trust="high", measured_bytes=str(nbytes), counter=counter, framework=d["framework"], reproducible="true",
            scenario_json=json.dumps(d, sort_keys=True, separators=(",", ":")),
        )  # fmt: skip
        out.append(row)
    return out


def write_csv(rows: Iterable[dict[str, Any]], path: Path, columns: list[str] = COLUMNS) -> None:
    """Write rows in the data/measured format (every column, in order, quoted where needed)."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})


def append_csv(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Append rows to a data/measured CSV (its header written first when the file is new or empty); a file
    with other columns is refused rather than mixed."""
    import csv

    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with open(path, newline="") as f:
            head = next(csv.reader(f), [])
        if head != COLUMNS:
            raise ScenarioError(
                "--csv", f"{str(path)!r} has other columns than data/measured's; give a new file"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})


def local_gpu(sc: Scenario) -> Scenario:
    """The scenario on the card it is measured on: its catalog id, else a card of its memory."""
    import torch

    from memsim_widget.catalog.gpus import canonical_gpu_id

    name = torch.cuda.get_device_name(0)
    gid = canonical_gpu_id(name)
    if gid is not None:
        return sc.replace(gpu=gid)
    return sc.replace(gpu={"memory_gib": torch.cuda.get_device_properties(0).total_memory / GiB})


def report(sc: Scenario, reading: dict[str, Any], env: dict[str, str]) -> str:
    """Measured next to predicted per counter, with the error, the peak's moment and the versions."""
    from memsim_widget.engine.core import estimate

    est = estimate(sc)
    lines = [f"{'counter':<12}{'measured':>12}{'predicted':>12}{'error':>9}"]
    for counter, (key, attr) in COUNTERS.items():
        got, want = int(reading[key]), int(getattr(est, attr))
        err = (want - got) / got * 100 if got else float("nan")
        lines.append(f"{counter:<12}{got / GiB:>9.2f} GiB{want / GiB:>8.2f} GiB{err:>+8.1f}%")
    lines.append(f"peak at    {reading.get('peak_at', '?')} (memsim: {est.peak_phase})")
    if reading.get("peak_frame"):
        lines.append(f"allocation {reading['peak_frame']}")
    lines.append("versions   " + ", ".join(f"{k} {v}" for k, v in env.items()))
    lines.append("error = (predicted - measured) / measured; a negative error under-predicts (an OOM risk)")
    return "\n".join(lines)


# ----- the command --------------------------------------------------------------------------------------------
def add_measure(sub: argparse._SubParsersAction, add_overrides: Callable[[argparse.ArgumentParser], None],
                add_from: Callable[[argparse.ArgumentParser], None], run_cmd: Callable[[argparse.Namespace], int]) -> None:  # fmt: skip
    """The ``measure`` subcommand."""
    p = sub.add_parser(
        "measure",
        help="run three real training steps on the local CUDA GPU and compare with the prediction",
        description="Build the scenario's model with random weights (no download), run three real training steps "
        "on the local CUDA GPU, and print measured allocated / reserved / nvidia-smi next to memsim's prediction "
        "with the error, the moment of the peak and the versions. One GPU, SFT, full or LoRA. Without CUDA it "
        "exits 2. Details: docs/measure.md.",
    )
    p.add_argument("scenario", nargs="?", help="scenario JSON file, or '-' to read stdin")
    p.add_argument("--steps", type=int, default=STEPS, help=f"training steps (default {STEPS})")
    p.add_argument("--csv", metavar="FILE", help="append three rows in the data/measured format to FILE")
    p.add_argument("--name", default="measure", help="the rows' id stem (default 'measure')")
    add_overrides(p)
    add_from(p)
    p.set_defaults(func=run_cmd)


def cmd_measure(args: argparse.Namespace, data: dict[str, Any]) -> int:
    """Measure the scenario on this machine's GPU; exit 2 with one line where there is none."""
    from memsim_widget.scenario import Scenario

    reason = require_cuda()
    if reason:
        raise ScenarioError("measure", reason)
    sc = Scenario.from_dict(data)
    check_measurable(sc)
    if not 1 <= args.steps <= 100:
        raise ScenarioError("--steps", f"must be from 1 to 100, got {args.steps}")
    sc = local_gpu(sc)
    reading = run(sc, [sc.seq_len] * args.steps)
    env = environment()
    print(report(sc, reading, env))
    if args.csv:
        append_csv(rows_for(args.name, sc, reading, env, tool="memsim measure",
                            note=f"peak at {reading['peak_at']}"), Path(args.csv))  # fmt: skip
        print(f"appended 3 rows to {args.csv}", file=sys.stderr)
    return 0
