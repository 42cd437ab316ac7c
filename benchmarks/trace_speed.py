"""Time and peak RAM of tracing a 7B-parameter training step on fake tensors (target: < 60 s, < 2 GB).

Run: python benchmarks/trace_speed.py
"""

from __future__ import annotations

import resource
import time
import warnings

from memsim_widget.scenario import Scenario
from memsim_widget.trace.api import trace_scenario

if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    for model, seq in (("llama-2-7b", 2048), ("mistral-7b", 4096)):
        t0 = time.perf_counter()
        result = trace_scenario(Scenario(model=model, seq_len=seq))
        secs = time.perf_counter() - t0
        rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        print(
            f"{model} b=1 s={seq} bf16 AdamW, two steps: {secs:.1f} s, {result.ops:,} ops, "
            f"process peak RSS {rss_gb:.2f} GB; traced peak {result.peak_bytes / 1024**3:.2f} GiB "
            f"at {result.peak_phase}"
        )
