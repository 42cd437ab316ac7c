"""FSDP2 with torchao's float8 Linears, with and without the fp8 all-gather, traced on the fake process group.

Run: python benchmarks/fp8_all_gather.py

The small Llama (bf16, b2 s512) on dp=2 ZeRO-3 (FSDP2 ``fully_shard``, trace/distributed.py): bf16, float8
tensorwise (16-bit all-gather, cast after), and float8 with ``enable_fsdp_float8_all_gather`` (torchao casts each
weight shard to fp8 before FSDP gathers it). The converter runs after the model's parameters become fake tensors
and before FSDP wraps it, as torchtitan converts before it parallelises. Prints each rank-0 trace's peak and bytes by
role (docs/fidelity.md, "fp8"); the scenario has no key for the fp8 all-gather, so no engine figure is compared.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data"))  # the case matrices are test data, not in the wheel

from fidelity_cases import CASES  # noqa: E402

from memsim_widget.scenario import Scenario  # noqa: E402


def trace(mode: str) -> object:
    """Rank 0's trace of the dp=2 step: mode "bf16", "float8" or "float8+all-gather"."""
    import memsim_widget.trace.distributed as dist
    from memsim_widget.trace.float8 import import_torchao_quietly

    import_torchao_quietly()
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    fakeify = dist.fakeify_meta

    def fakeify_then_convert(model):  # noqa: ANN001, ANN202
        fakeify(model)
        if mode != "bf16":
            config = Float8LinearConfig(enable_fsdp_float8_all_gather=mode.endswith("all-gather"))
            convert_to_float8_training(
                model, config=config, module_filter_fn=lambda _m, fqn: "lm_head" not in fqn
            )

    dist.fakeify_meta = fakeify_then_convert
    try:
        data = {**dict(CASES)["llama bf16 sdpa b2 s512"], "parallel": {"dp": 2, "zero": 3}}
        return dist.trace_distributed(Scenario.from_dict(data))
    finally:
        dist.fakeify_meta = fakeify


def main() -> None:
    for mode in ("bf16", "float8", "float8+all-gather"):
        r = trace(mode)
        roles = {k: v for k, v in r.by_role.items() if v}  # type: ignore[attr-defined]
        print(f"{mode:18s} peak {r.peak_bytes:>11,} ({r.peak_phase})  step-2 optimizer "  # type: ignore[attr-defined]
              f"{r.phase_peaks['2/optimizer_step']:>11,}  {roles}", flush=True)  # type: ignore[attr-defined]  # fmt: skip


if __name__ == "__main__":
    main()
