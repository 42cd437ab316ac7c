"""Time and peak RAM of tracing a 7-8B training step on fake tensors, on one GPU and one rank of an FSDP job.

Targets: one GPU < 60 s and < 2 GB; one rank of an 8B Llama under FSDP2 (llama-3.1-8b, b1 s2048, bf16,
zero 3) at dp 8 and dp 64 <= 30 s and < 2 GB RSS on 2 cores. Each case runs in its own process, pinned to
two cores (where the OS allows), so the RSS is that case's alone.

Run: python benchmarks/trace_speed.py [--cores 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings

#: (label, scenario dict)
CASES = [
    ("llama-2-7b b1 s2048 bf16, 1 GPU", {"model": "llama-2-7b", "seq_len": 2048}),
    ("mistral-7b b1 s4096 bf16, 1 GPU", {"model": "mistral-7b", "seq_len": 4096}),
    *(
        (
            f"llama-3.1-8b b1 s2048 bf16 zero 3, rank 0 of dp {dp}",
            {"model": "llama-3.1-8b", "seq_len": 2048, "parallel": {"dp": dp, "zero": 3}},
        )
        for dp in (8, 64)
    ),
]


def run_case(data: dict, cores: int) -> dict:
    """Trace one scenario in this process (pinned to ``cores`` cores) and return its figures."""
    import torch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    torch.set_num_threads(cores)
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import trace_scenario

    t0 = time.perf_counter()
    result = trace_scenario(Scenario.from_dict(data), rank=None)
    return {
        "seconds": time.perf_counter() - t0,
        "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "ops": result.ops,
        "peak_gib": result.peak_bytes / 1024**3,
        "phase": result.peak_phase,
    }


def main() -> None:
    """Run every case in a child process and print one line each."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        warnings.filterwarnings("ignore")
        print(json.dumps(run_case(json.loads(args.child), args.cores)))
        return
    for label, data in CASES:
        cmd = [sys.executable, __file__, "--cores", str(args.cores), "--child", json.dumps(data)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"{label}, two steps on {args.cores} cores: {r['seconds']:.1f} s, {r['ops']:,} ops, process peak "
            f"RSS {r['rss_gb']:.2f} GB; traced peak {r['peak_gib']:.2f} GiB at {r['phase']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
