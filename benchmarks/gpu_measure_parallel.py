"""UNTESTED ON GPU (prepared without a device; issue 24 item 6). One rank of a multi-GPU layout, measured on one
real GPU: PyTorch's fake process group makes every collective a no-op, so FSDP2 and DTensor run their real code
and allocate real CUDA memory for that rank, with no communication. Three real steps per layout (random weights
from the HF config, nothing downloaded); the third step's ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` are printed beside the engine's figures for the same rank, one JSON object per layout.

Run on a machine with a CUDA GPU (each layout in a subprocess of its own, so each starts from a fresh context):
    python benchmarks/gpu_measure_parallel.py --out measured_parallel.jsonl
    python benchmarks/gpu_measure_parallel.py --list
    python benchmarks/gpu_measure_parallel.py --cpu-smoke   # the same code on CPU: a tiny model, counters 0
Pipeline stages are not here: the tracer's stage builder (trace/pipeline.py) runs on fake tensors only.
Without CUDA (and without --cpu-smoke) it exits with status 2 and says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# the engine-vs-trace case matrices are test data (tests/data), not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_parallel_cases import LLAMA3_V128K, QWEN25_V152K  # noqa: E402

_REAL = {"micro_batch_size": 1, "seq_len": 2048}
_TT = {"precision": "amp-bf16", "framework": "torchtitan"}
#: name -> scenario dict (one rank, rank 0, of each).
LAYOUTS: dict[str, dict[str, Any]] = {
    "fsdp2 dp8 bf16": {"model": LLAMA3_V128K, **_REAL, "parallel": {"dp": 8, "zero": 3}},
    "fsdp2 dp8 torchtitan": {"model": LLAMA3_V128K, **_REAL, **_TT, "parallel": {"dp": 8, "zero": 3}},
    "2-D dp4 x tp2 torchtitan sp loss-parallel": {
        "model": LLAMA3_V128K,
        **_REAL,
        **_TT,
        "parallel": {"dp": 4, "tp": 2, "zero": 3, "sequence_parallel": True},
    },  # fmt: skip
    "tp2 hf plan": {"model": QWEN25_V152K, **_REAL, "parallel": {"tp": 2}},
    "tp4 torchtitan plan sp loss-parallel (hybrid)": {
        "model": LLAMA3_V128K,
        **_REAL,
        "parallel": {"tp": 4, "sequence_parallel": True, "tp_plan": "torchtitan"},
    },  # fmt: skip
    "replicate dp2 bf16": {"model": LLAMA3_V128K, **_REAL, "parallel": {"dp": 2}},
}


#: ``--cpu-smoke``: every layout's model replaced by this one (heads divisible by tp 4), 32 tokens.
SMOKE_MODEL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 256, "tie_word_embeddings": False}  # fmt: skip


def layout(name: str, smoke: bool = False) -> dict[str, Any]:
    """``LAYOUTS[name]``, with the tiny model and 32 tokens under ``--cpu-smoke``."""
    d = LAYOUTS[name]
    return {**d, "model": SMOKE_MODEL, "seq_len": 32} if smoke else d


def measure(name: str, steps: int = 3, smoke: bool = False) -> dict[str, Any]:
    """Run ``steps`` real steps of rank 0 of ``LAYOUTS[name]`` on CUDA (``smoke``: a tiny model on CPU, counters
    0); the last step's peaks and the engine's."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from memsim_widget.catalog.models import resolve_model_config
    from memsim_widget.engine.core import estimate
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.distributed import _loss_outside, parallelize
    from memsim_widget.trace.fake_dist import fake_world
    from memsim_widget.trace.hf import build_hf_config, build_hf_model
    from memsim_widget.trace.run import param_groups
    from memsim_widget.trace.torch_recipe import precision_dtypes

    device = "cpu" if smoke else "cuda"
    sc = Scenario.from_dict(layout(name, smoke))
    par = sc.parallel
    cfg = build_hf_config(dict(resolve_model_config(sc.model)), sc.attention)
    wdtype, _amp = precision_dtypes(sc.precision)
    shape = {k: v for k, v in (("dp", par.dp), ("tp", par.tp)) if v > 1}
    loss_fn, context = None, _null()
    make = lambda: _batch(sc, cfg, device)  # noqa: E731
    if par.tp > 1:  # global position_ids under SP; loss_fn and loss_parallel() under loss parallel
        from memsim_widget.trace import tp_plan

        make, loss_fn, context = tp_plan.trace_hooks(sc, make)
    # entered once around the whole run, as the tracer does (trace/distributed.py): a generator context cannot
    # be re-entered per step, and its mesh patches matter when the mesh is built
    with fake_world(0, par.world_size), context:
        mesh = init_device_mesh(device, tuple(shape.values()), mesh_dim_names=tuple(shape))
        model = build_hf_model(cfg, wdtype, sc.attention).to(device)
        notes: list[str] = []
        parallelize(model, mesh, sc, notes, reshard_after_forward=par.reshard_after_forward)
        if loss_fn is None and _loss_outside(sc):
            from memsim_widget.trace.run import drop_labels
            from memsim_widget.trace.tp_plan import loss_parallel_loss

            model.register_forward_pre_hook(drop_labels, with_kwargs=True)
            loss_fn = loss_parallel_loss
        # a foreach optimizer refuses a group mixing DTensors and plain tensors (a TP plan leaves the norms plain)
        params = param_groups([p for p in model.parameters() if p.requires_grad])
        opt = torch.optim.AdamW(params, lr=1e-5, foreach=True)
        peaks = []
        for _ in range(steps):
            if not smoke:
                torch.cuda.reset_peak_memory_stats()
            batch = make()
            out = model(**batch)
            loss = loss_fn(out, batch) if loss_fn is not None else out.loss
            del out
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            if smoke:
                peaks.append((0, 0))
                continue
            torch.cuda.synchronize()
            peaks.append((torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))
    rank = estimate(sc).ranks[0]
    alloc, reserved = peaks[-1]
    return {
        "name": name,
        "gpu": "cpu (smoke)" if smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "measured_allocated_bytes": alloc,
        "measured_reserved_bytes": reserved,
        "engine_allocated_bytes": rank.peak_allocated_bytes,
        "engine_reserved_bytes": rank.peak_reserved_bytes,
        "error_allocated": (rank.peak_allocated_bytes - alloc) / alloc if alloc else None,
        "notes": notes,
    }


def _batch(sc: Any, cfg: Any, device: str = "cuda") -> dict[str, Any]:
    import torch

    ids = torch.randint(0, cfg.vocab_size, (sc.micro_batch_size, sc.seq_len), device=device)
    return {"input_ids": ids, "labels": ids.clone()}


def _null() -> Any:
    import contextlib

    return contextlib.nullcontext()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="append one JSON object per layout to this file")
    ap.add_argument("--list", action="store_true", help="print the layouts and exit (no GPU needed)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the subprocess: measure one layout, print its JSON
    ap.add_argument(
        "--budget", type=float, default=540, help="seconds for all layouts (each in a subprocess)"
    )
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="the same code on CPU, a tiny model (counters 0)"
    )
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(LAYOUTS))
        return 0
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("gpu_measure_parallel: no CUDA device here (this script needs one GPU)", file=sys.stderr)
        return 2
    if args.one:
        print(json.dumps(measure(args.one, smoke=args.cpu_smoke)))
        return 0
    start = time.monotonic()
    for name in LAYOUTS:
        left = args.budget - (time.monotonic() - start)
        if left < 20:
            row: dict[str, Any] = {"name": name, "error": f"skipped: {left:.0f} s left of the budget"}
        else:
            row = _run_one(name, args.cpu_smoke, left)
        print(json.dumps(row), flush=True)
        if args.out:  # after each layout: a run cut short keeps what it measured
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
    return 0


def _run_one(name: str, smoke: bool, seconds: float) -> dict[str, Any]:
    """One layout in a subprocess of its own (a fresh CUDA context), killed after ``seconds``."""
    cmd = [sys.executable, __file__, "--one", name, *(["--cpu-smoke"] if smoke else [])]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"timed out after {seconds:.0f} s"}
    line = run.stdout.strip().splitlines()[-1] if run.returncode == 0 and run.stdout.strip() else None
    return json.loads(line) if line else {"name": name, "error": run.stderr.strip()[-2000:]}


if __name__ == "__main__":
    raise SystemExit(main())
