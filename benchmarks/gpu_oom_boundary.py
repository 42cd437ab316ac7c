"""UNTESTED ON GPU (prepared without a device; issue 22 item 5b). The measured OOM boundary: on one real GPU,
the process's caching allocator is capped with ``torch.cuda.set_per_process_memory_fraction`` to emulate a 24,
40, 48 and 80 GB card, and the largest micro-batch and the largest sequence that run three real training steps
are found by search, per scenario; ``benchmarks/oom_boundary_compare.py`` compares them with the engine.

The cap. PyTorch checks the fraction in the caching allocator only: a cudaMalloc that would take the segments
it holds (``max_memory_reserved``'s counter) past ``fraction x total_memory`` fails as an OOM
(c10/cuda/CUDACachingAllocator.cpp, ``setMemoryFraction`` / ``alloc_block``'s ``allowed_memory_maximum``;
the expandable-segment path checks the same limit). The CUDA context, lazily loaded kernels and cuBLAS' handles
live outside that cap. On the emulated card they would take part of its capacity, so the cap is the card's
reported capacity (the catalog's ``memory_bytes``, what ``total_memory`` reports) less this host's context as
measured after a warm-up step (device used memory less reserved): ``cap_bytes``, and ``fraction = cap_bytes /
total_memory``. Both are written with each row; the comparator's default mode asks the engine about exactly that
allocator room (the context cancels), its ``card`` mode about the emulated card itself. Where the emulated card
is as large as the host (80 GB on an H100), kernels loaded after the warm-up can make the device itself, not the
cap, the limit by a few hundred MiB: those rows' ``cap_bytes`` may overstate the room.

The search. Each (scenario, card, dimension) starts at the engine's own prediction for that room and moves by
doubling steps (up while it runs, down while it fails), then bisects; with a right prediction it costs two
probes. Memory is assumed to grow with the micro-batch and the sequence. A probe builds the model (random
weights, nothing downloaded), runs three steps through ``memsim_widget.measure.train_steps`` (the code path of
``memsim measure``), then frees everything: ``gc.collect``, the cuBLAS workspaces cleared, ``empty_cache``, peak
stats reset, so the next probe starts from an empty allocator as a fresh process would (checked: a probe that
leaves memory allocated is noted in the row). What was alive after a case's warm-up probe (torch's,
transformers' and peft's modules, imported by then) is frozen out of the collector during its searches
(``frozen_heap``): a full collection then scans only what the probes made (on a 2-core CPU the smoke's
collections took 37 s of 64, a third of a second each over the imported modules). The scenarios run in one
subprocess (torch, transformers and CUDA start once), each under an equal share of the time left; a crash gives up the scenario it was on and another
subprocess takes the rest. Rows are written after every search.

Run on a machine with one CUDA GPU (about 8 minutes by default):
    python benchmarks/gpu_oom_boundary.py --out-dir data/measured
    python benchmarks/gpu_oom_boundary.py --cards rtx-4090 --only llama1b-bf16 --budget 60
    python benchmarks/gpu_oom_boundary.py --resume ...     # skip searches already exact in the CSVs
    python benchmarks/gpu_oom_boundary.py --list           # scenarios and cards (no GPU needed)
    python benchmarks/gpu_oom_boundary.py --cpu-smoke --out-dir /tmp/x   # the whole logic on CPU: tiny model,
                                                           # OOM simulated at a known token limit
Without CUDA (and without --cpu-smoke) it exits with status 2.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oom_boundary_compare as obc  # noqa: E402

from memsim_widget import measure  # noqa: E402
from memsim_widget.catalog.gpus import resolve_gpu  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
#: The whole run (startup included) stays inside this by default: a session's command may last 10 minutes.
BUDGET_SECONDS = 480
#: The emulated cards (catalog ids: their ``memory_bytes`` is the capacity ``total_memory`` reports), in order.
CARDS = ("rtx-4090", "a100-40gb", "l40s", "h100-sxm-80gb")
DIMS = ("micro_batch_size", "seq_len")
#: Step lengths of a variable-length scenario, as shares of its longest (three steps, the longest second).
VARIABLE_SHARES = (0.25, 1.0, 0.625)


@dataclass(frozen=True)
class Case:
    """One scenario whose boundary is searched: its base scenario, which dimensions, and what it needs."""

    name: str
    scenario: dict[str, Any]
    dims: tuple[str, ...] = DIMS
    variable: bool = False  # step lengths vary (padding "longest"): VARIABLE_SHARES of the longest
    needs: str = ""  # a module that must import (bitsandbytes for QLoRA)
    note: str = ""

    def lengths(self, sc: Scenario) -> list[int]:
        """Three steps' sequence lengths for ``sc`` (the longest is its seq_len)."""
        if not self.variable:
            return [sc.seq_len] * 3
        return [max(8, round(sc.seq_len * s / 8) * 8) if s < 1 else sc.seq_len for s in VARIABLE_SHARES]


_L1B = {"model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 1024}
_Q05 = {"model": "qwen2.5-0.5b", "micro_batch_size": 1, "seq_len": 1024}
_LORA = {"method": "lora", "lora": {"rank": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}}
CASES: tuple[Case, ...] = (
    Case("llama1b-bf16", _L1B, note="dense full fine-tune, pure bf16, foreach AdamW"),
    Case("llama1b-bf16-ckpt", {**_L1B, "activation_checkpointing": "full"}, note="checkpointed"),
    Case("llama1b-lora", {**_L1B, **_LORA}, note="peft LoRA, fp32 adapters on a bf16 base"),
    Case("qwen05b-bf16", _Q05, note="152k vocabulary: the loss buffers dominate"),
    Case(
        "qwen05b-bf16-longest",
        {**_Q05, "padding": "longest"},
        variable=True,
        note="step lengths vary (padding longest)",
    ),  # fmt: skip
    Case("llama1b-bf16-fused", {**_L1B, "optimizer_impl": "fused"}, note="fused AdamW"),
    Case("llama1b-amp", {**_L1B, "precision": "amp-bf16"}, note="fp32 weights, bf16 autocast"),
    Case(
        "qwen05b-lora-ckpt",
        {**_Q05, **_LORA, "activation_checkpointing": "full"},
        note="LoRA + checkpointing",
    ),
    Case(
        "llama1b-bf16-longest-ckpt",
        {**_L1B, "padding": "longest", "activation_checkpointing": "full"},
        variable=True,
        note="checkpointed, step lengths vary",
    ),  # fmt: skip
    Case(
        "gpt2m-amp-eager",
        {
            "model": "gpt2-medium",
            "precision": "amp-bf16",
            "attention": "eager",
            "micro_batch_size": 1,
            "seq_len": 1024,
        },
        note="learned positions: sequence <= 1024",
    ),  # fmt: skip
    Case("qwen3-06b-bf16", {**_Q05, "model": "qwen3-0.6b"}, note="per-head q/k RMSNorm"),
    Case(
        "llama1b-qlora",
        {**_L1B, **_LORA, "method": "qlora"},
        needs="bitsandbytes",
        note="bitsandbytes nf4 base (quantised from random bf16 weights), peft LoRA",
    ),  # fmt: skip
)

#: measure's model builder as imported: ``qlora_build`` stands in for it while a QLoRA case runs, and builds on it.
BASE_BUILD = measure.build_model
#: ``--cpu-smoke``: a tiny model, and an OOM raised when a probe's tokens (micro-batch x longest step) exceed
#: ``SMOKE_TOKENS_PER_GIB`` per whole GiB of the cap, so the boundary is known in advance.
SMOKE_MODEL = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64,
               "max_position_embeddings": 4096}  # fmt: skip
SMOKE_TOKENS_PER_GIB = 16
SMOKE_CASES: tuple[Case, ...] = (
    Case("smoke-full", {"model": SMOKE_MODEL, "micro_batch_size": 1, "seq_len": 64, "precision": "fp32"}),
    Case(
        "smoke-lora-longest",
        {
            "model": SMOKE_MODEL,
            "micro_batch_size": 1,
            "seq_len": 64,
            "precision": "fp32",
            "padding": "longest",
            "method": "lora",
            "lora": {"rank": 4, "targets": ["q_proj", "v_proj"]},
        },
        variable=True,
    ),  # fmt: skip
    Case(
        "smoke-qlora",
        {
            "model": SMOKE_MODEL,
            "micro_batch_size": 1,
            "seq_len": 64,
            "method": "qlora",
            "lora": {"rank": 4, "targets": ["q_proj", "v_proj"]},
        },
        needs="bitsandbytes",
    ),  # fmt: skip
)
#: ``--cpu-smoke``'s host: what a CPU reports instead of a GPU.
SMOKE_HOST = {"gpu": "h100-sxm-80gb", "total": 85045477376, "context": GiB // 2}


def smoke_limit_tokens(cap_bytes: int) -> int:
    """The simulated OOM limit of ``--cpu-smoke`` for an allocator cap."""
    return cap_bytes // GiB * SMOKE_TOKENS_PER_GIB


# ----- the search -------------------------------------------------------------------------------------------
@dataclass
class Search:
    """The outcome of one boundary search, in units (samples, or ``SEQ_STEP`` tokens)."""

    good: int | None = None  # the largest value seen to run
    bad: int | None = None  # the smallest value seen to fail
    probes: list[tuple[int, bool]] = field(default_factory=list)
    status: str = "bracket"


def search(runs: Callable[[int], bool], start: int | None, lo: int, hi: int,
           time_left: Callable[[], bool] = lambda: True) -> Search:  # fmt: skip
    """The largest n in [lo, hi] with runs(n), memory growing with n: from ``start`` (the prediction; lo when
    None) up by doubling steps while it runs or down while it fails, then bisection. ``status``: ``exact``
    (bad = good + 1), ``at_top`` (hi runs), ``none_fit`` (lo fails) or ``bracket`` (stopped by ``time_left``)."""
    s = Search()

    def probe(n: int) -> bool:
        ok = runs(n)
        s.probes.append((n, ok))
        if ok:
            s.good = n if s.good is None else max(s.good, n)
        else:
            s.bad = n if s.bad is None else min(s.bad, n)
        return ok

    n, step = min(max(start if start is not None else lo, lo), hi), 1
    up = probe(n)
    while time_left():
        if up:
            if n >= hi or (s.bad is not None and s.bad - n <= 1):
                break
            n = min(n + step, hi)
        else:
            if n <= lo or (s.good is not None and n - s.good <= 1):
                break
            n = max(n - step, lo)
        if probe(n) != up:
            break
        step *= 2
    while s.good is not None and s.bad is not None and s.bad - s.good > 1 and time_left():
        probe((s.good + s.bad) // 2)
    if s.good is not None and s.good >= hi:
        s.status = "at_top"
    elif s.bad is not None and s.bad <= lo:
        s.status = "none_fit"
    elif s.good is not None and s.bad is not None and s.bad - s.good == 1:
        s.status = "exact"
    return s


# ----- one probe --------------------------------------------------------------------------------------------
def is_oom(exc: BaseException) -> bool:
    """A failure to allocate: the caching allocator's OOM, or a CUDA library that could not get memory."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "ALLOC_FAILED" in text)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside: the objects alive on entry are left out of every collection (``gc.freeze``), so ``cleanup``'s
    ``gc.collect`` after a probe walks only the objects made since (the probe's model, its cycles) instead of every
    imported module's; on exit they are handed back to the collector (``gc.unfreeze``), as if never frozen."""
    import gc

    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def cleanup(device: str) -> int:
    """Free everything a probe left, as a fresh process would start; the bytes still allocated (0 expected)."""
    import gc

    import torch

    gc.collect()
    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def probe_runs(case: Case, sc: Scenario, device: str, limit_tokens: int | None = None) -> tuple[bool, int]:
    """Run three steps of ``sc``; (whether they ran, bytes left allocated afterwards). ``limit_tokens``
    (``--cpu-smoke``): an OOM simulated when micro-batch x the longest step exceeds it."""
    import torch

    from memsim_widget import measure

    lengths = case.lengths(sc)
    ok = True
    try:
        if limit_tokens is not None and sc.micro_batch_size * max(lengths) > limit_tokens:
            raise torch.cuda.OutOfMemoryError("simulated (--cpu-smoke)")
        measure.train_steps(sc, lengths, device)
    except Exception as exc:  # an OOM is an answer; anything else is the row's error
        if not is_oom(exc):
            raise
        ok = False
    return ok, cleanup(device)


def qlora_build(sc: Scenario, device: str = "cuda") -> tuple[Any, Any, str]:
    """UNTESTED (needs bitsandbytes and CUDA). The scenario's model with its Linear layers (not the output
    layer) as bitsandbytes nf4 ``Linear4bit`` holding the random bf16 weights quantised, then peft LoRA."""
    import bitsandbytes as bnb
    import peft
    import torch

    model, config, family = BASE_BUILD(sc.replace(method="full"), device)
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, torch.nn.Linear) and "lm_head" not in f"{name}.{child_name}":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, quant_type="nf4")  # fmt: skip
                q.weight = bnb.nn.Params4bit(child.weight.data.cpu(), requires_grad=False, quant_type="nf4")
                setattr(mod, child_name, q.to(device))
                del child
    torch.cuda.empty_cache()
    alpha: Any = sc.lora.alpha
    lcfg = peft.LoraConfig(r=sc.lora.rank, lora_alpha=alpha, target_modules=list(sc.lora.targets))
    model = peft.get_peft_model(model, lcfg)
    model.train()
    return model, config, family


# ----- a scenario's searches (the child process) -----------------------------------------------------------
def host_info(device: str, smoke: bool) -> dict[str, Any]:
    """This GPU: catalog id, total_memory and versions."""
    import torch
    import transformers

    from memsim_widget.catalog.gpus import canonical_gpu_id

    base = {"torch": torch.__version__, "transformers": transformers.__version__,
            "date": dt.date.today().isoformat()}  # fmt: skip
    if smoke:
        return {**base, "gpu": SMOKE_HOST["gpu"], "total": SMOKE_HOST["total"]}
    name = torch.cuda.get_device_name(0)
    return {**base, "gpu": canonical_gpu_id(name) or "h100-sxm-80gb", "gpu_name": name,
            "total": int(torch.cuda.get_device_properties(0).total_memory)}  # fmt: skip


def context_bytes(device: str, smoke: bool) -> int:
    """What lives outside the allocator now (after a warm-up probe): this process's used memory less reserved."""
    if smoke:
        return int(SMOKE_HOST["context"])
    import torch

    from memsim_widget.measure import device_used_bytes

    torch.cuda.synchronize()
    # this process's used memory per nvidia-smi (another process's context is not ours), else total - free
    return int(device_used_bytes(torch) - torch.cuda.memory_reserved())


def run_case(case: Case, cards: list[str], deadline: float, device: str, smoke: bool,
             skip: set[tuple[str, str]], emit: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """Every (dimension, card) search of ``case`` until ``deadline`` (every card's micro-batch first: cheaper
    probes than long sequences); each row passed to ``emit``."""
    import torch

    host = host_info(device, smoke)
    base = Scenario.from_dict({**case.scenario, "gpu": host["gpu"]})
    if device == "cuda":  # the warm-up runs uncapped: the last case's cap is lifted (1.0: no limit)
        torch.cuda.set_per_process_memory_fraction(1.0)
    warm, _ = probe_runs(case, base.replace(micro_batch_size=1, seq_len=min(base.seq_len, 256)), device)
    ctx = context_bytes(device, smoke)
    # after the warm-up: the modules its model, loss and optimizer imported are frozen too
    with frozen_heap():
        for dim, card in [(d, c) for d in case.dims for c in cards]:
            if (card, dim) in skip:
                continue
            _search_card(case, card, dim, base, ctx, host, warm, deadline, device, smoke, emit)


def _search_card(case: Case, card: str, dim: str, base: Scenario, ctx: int, host: dict[str, Any], warm: bool,
                 deadline: float, device: str, smoke: bool, emit: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """The boundary search of ``dim`` on ``card`` (the cap set, the row built and passed to ``emit``)."""
    import torch

    card_bytes = resolve_gpu(card).memory_bytes
    cap = card_bytes - ctx
    fraction = cap / host["total"]
    if device == "cuda":
        torch.cuda.set_per_process_memory_fraction(min(max(fraction, 0.0), 1.0))
    sc = base if dim == "micro_batch_size" else base.replace(micro_batch_size=1)
    u, hi = obc.units(dim), obc.top(sc, dim)
    row = {"id": f"{case.name}|{card}|{dim}", "scenario": case.name, "dim": dim,
           "fixed": f"seq_len={sc.seq_len}" if dim == "micro_batch_size" else "micro_batch_size=1",
           "card": card, "card_id": card, "card_bytes": card_bytes, "host_gpu": host["gpu"],
           "host_total_bytes": host["total"], "context_bytes": ctx, "cap_bytes": cap,
           "fraction": f"{fraction:.6f}", "lo": u, "hi": hi * u,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "torch": host["torch"],
           "transformers": host["transformers"], "date": host["date"],
           "scenario_json": json.dumps(sc.to_dict(), sort_keys=True, separators=(",", ":")),
           "note": case.note + ("" if warm else "; the warm-up probe ran out of memory")}  # fmt: skip
    if time.time() >= deadline:
        emit({**row, "status": "skipped", "probes": 0, "seconds": 0})
        return
    emit({**row, **one_search(case, sc, dim, card, cap, host["gpu"], deadline, device, smoke, row["note"])})


def one_search(case: Case, sc: Scenario, dim: str, card: str, cap: int, host_gpu: str, deadline: float,
               device: str, smoke: bool, note: str) -> dict[str, Any]:  # fmt: skip
    """One boundary search from the engine's prediction: the row's result columns."""
    t0, u, hi = time.time(), obc.units(dim), obc.top(sc, dim)
    limit = smoke_limit_tokens(cap) if smoke else None
    dirty: list[int] = []

    def runs(k: int) -> bool:
        ok, left = probe_runs(case, sc.replace(**{dim: k * u}), device, limit)
        if left:
            dirty.append(left)
        return ok

    try:
        pred = obc.predicted_max(sc, dim, "room", cap, card, host_gpu, hi)
        s = search(runs, None if pred is None else pred // u, 1, hi, lambda: time.time() < deadline)
    except Exception as exc:  # a crash other than an OOM: the row says so, the next search goes on
        cleanup(device)
        healthy(device)  # unless CUDA itself is broken: then the process ends, and the parent starts another
        return {"status": "error", "probes": 0, "seconds": round(time.time() - t0, 1),
                "note": f"{note}; {type(exc).__name__}: {str(exc)[:300]}"}  # fmt: skip
    if dirty:
        note += f"; memory left allocated after a probe: {max(dirty)} B"
    return {"measured_max": "" if s.good is None else s.good * u, "first_oom": "" if s.bad is None else s.bad * u,
            "status": s.status, "probes": len(s.probes), "start": "" if pred is None else pred,
            "seconds": round(time.time() - t0, 1), "note": note}  # fmt: skip


def healthy(device: str) -> None:
    """Raise if the CUDA context no longer works (a sticky error: every later probe would fail)."""
    if device == "cuda":
        import torch

        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()


def child(cases: list[Case], cards: list[str], end: float, device: str, smoke: bool,
          skip: set[tuple[str, str, str]], emit: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """The cases in order, each under an equal share of the time left to ``end`` (time a case leaves unused
    flows to the ones after); a ``{"done": name}`` line after each."""
    from memsim_widget import measure

    build = measure.build_model
    for i, case in enumerate(cases):
        deadline = time.time() + max(end - time.time(), 0) / (len(cases) - i)
        if case.needs:
            try:
                __import__(case.needs)
            except ImportError:
                emit({"done": case.name, "why": f"skipped: {case.needs} does not import"})
                continue
        if case.scenario.get("method") == "qlora":
            measure.build_model = qlora_build  # train_steps builds through this name
        try:
            run_case(
                case, cards, deadline, device, smoke, {(c, d) for n, c, d in skip if n == case.name}, emit
            )
        finally:
            measure.build_model = build
        emit({"done": case.name})


# ----- the parent: the cases in a subprocess (another after a crash), rows to CSV ----------------------------------------------------
def csv_path(out_dir: Path, card: str) -> Path:
    return out_dir / f"oom_boundary_{card}.csv"


def read_existing(out_dir: Path, cards: list[str]) -> dict[str, list[dict[str, str]]]:
    """The rows already in each card's CSV (``--resume``)."""
    out: dict[str, list[dict[str, str]]] = {}
    for card in cards:
        p = csv_path(out_dir, card)
        out[card] = obc.read_rows([p]) if p.exists() else []
    return out


def write_rows(out_dir: Path, card: str, rows: list[dict[str, Any]]) -> None:
    """Rewrite one card's CSV (a run cut short keeps every row written so far)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(csv_path(out_dir, card), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=obc.COLUMNS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in obc.COLUMNS})


def run_child(cases: list[Case], cards: list[str], end: float, smoke: bool, skip: list[str],
              on_row: Callable[[dict[str, Any]], None]) -> tuple[list[str], str]:  # fmt: skip
    """Run ``cases`` in one subprocess (imports and CUDA start once), passing each row it prints to ``on_row``;
    killed a minute past ``end`` (a probe may overrun it). The cases it finished, and its error ('' if none)."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        *[c.name for c in cases],
        "--deadline",
        str(end),
        "--cards",
        *cards,
    ]
    cmd += ["--cpu-smoke"] if smoke else []
    cmd += [a for k in skip for a in ("--skip", k)]
    done: list[str] = []
    with tempfile.TemporaryFile(
        "w+"
    ) as err:  # a file, not a pipe: warnings can never fill it and block the child
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
        timer = threading.Timer(max(end - time.time(), 0) + 60, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if "done" in r:
                    done.append(r["done"])
                    if "why" in r:
                        print(f"{r['done']}: {r['why']}", flush=True)
                else:
                    on_row(r)
            proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        text = err.read()
    return done, "" if proc.returncode == 0 else f"exit {proc.returncode}: {text.strip()[-1500:]}"


def parent(
    cases: list[Case], cards: list[str], out_dir: Path, budget: float, smoke: bool, resume: bool
) -> int:
    """The cases in a subprocess (after a crash, the case it was on is given up and another subprocess takes
    the rest), the time shared equally among them; rows written per card as they come."""
    start = time.time()
    end = start + budget
    rows = read_existing(out_dir, cards) if resume else {c: [] for c in cards}
    done = {
        (r["scenario"], r["card"], r["dim"]) for rs in rows.values() for r in rs if r["status"] == "exact"
    }
    for c in cards:  # a resumed row that is not exact is searched again
        rows[c] = [r for r in rows[c] if (r["scenario"], r["card"], r["dim"]) in done]
    skip = ["|".join(k) for k in sorted(done)]

    def on_row(r: dict[str, Any]) -> None:
        rows[r["card"]].append(r)
        write_rows(out_dir, r["card"], rows[r["card"]])
        print(f"{r['scenario']:<26}{r['card']:<15}{r['dim']:<17} max {r.get('measured_max') or '-':>6}  "
              f"oom {r.get('first_oom') or '-':>6}  start {r.get('start') or '-':>6}  {r['status']:<9}"
              f"{r['probes']:>3} probes {r['seconds']:>6} s  ({time.time() - start:.0f} s)", flush=True)  # fmt: skip

    left = list(cases)
    while left and end - time.time() > 15:
        finished, err = run_child(left, cards, end, smoke, skip, on_row)
        if err:
            stuck = next((c.name for c in left if c.name not in finished), None)
            print(f"{stuck}: {err}", flush=True)
            finished.append(str(stuck))  # given up: not retried
        left = [c for c in left if c.name not in finished]
    for c in left:
        print(f"{c.name}: skipped, out of time", flush=True)
    for c in cards:
        write_rows(out_dir, c, rows[c])
    n = sum(len(v) for v in rows.values())
    print(f"wrote {n} rows to {out_dir}/oom_boundary_*.csv in {time.time() - start:.0f} s", flush=True)
    return 0 if n else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "data" / "measured")
    ap.add_argument("--cards", nargs="*", default=list(CARDS), help="emulated cards (catalog ids)")
    ap.add_argument("--only", nargs="*", help="scenario names")
    ap.add_argument("--budget", type=float, default=BUDGET_SECONDS, help="seconds for the whole run")
    ap.add_argument("--resume", action="store_true", help="keep exact rows of the CSVs and search the rest")
    ap.add_argument("--list", action="store_true")
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="tiny model on CPU, OOM simulated at a known limit"
    )
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--skip", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    pool = SMOKE_CASES if args.cpu_smoke else CASES
    cases = [c for c in pool if not args.only or c.name in args.only]
    for card in args.cards:
        resolve_gpu(card)  # an unknown card is one clear error before anything runs
    if args.list:
        for c in cases:
            print(f"{c.name:<28}{'+'.join(c.dims):<28}{json.dumps(c.scenario)}")
        print("cards: " + ", ".join(f"{c} ({resolve_gpu(c).memory_bytes / GiB:.2f} GiB)" for c in args.cards))
        return 0
    if not args.cpu_smoke:
        import torch

        if not torch.cuda.is_available():
            print("gpu_oom_boundary: no CUDA device (this measures real OOMs on a GPU; --cpu-smoke runs the "
                  "logic on CPU)", file=sys.stderr)  # fmt: skip
            return 2
    if args.child:
        chosen = [c for name in args.child for c in pool if c.name == name]
        skip = {tuple(k.split("|")) for k in args.skip}
        emit = lambda r: print(json.dumps(r), flush=True)  # noqa: E731
        child(
            chosen, args.cards, args.deadline, "cpu" if args.cpu_smoke else "cuda", args.cpu_smoke, skip, emit
        )  # type: ignore[arg-type]
        return 0
    return parent(cases, args.cards, args.out_dir, args.budget, args.cpu_smoke, args.resume)


if __name__ == "__main__":
    sys.exit(main())
