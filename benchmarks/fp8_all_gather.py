"""FSDP2 with torchao's float8 Linears, with and without the fp8 all-gather, traced on the fake process group.

Run: python benchmarks/fp8_all_gather.py [MODEL ...]   (MODELS keys; default both)

The small Llama (bf16, b2 s512) on dp=2 ZeRO-3 (FSDP2 ``fully_shard``, trace/distributed.py): bf16, float8
tensorwise (16-bit all-gather, cast after), and float8 with ``enable_fsdp_float8_all_gather`` (torchao casts each
weight shard to fp8 before FSDP gathers it). The converter runs after the model's parameters become fake tensors
and before FSDP wraps it, as torchtitan converts before it parallelises. Prints each rank-0 trace's peak and bytes by
role (docs/fidelity.md, "fp8"); the engine's ``fp8_all_gather`` rule is held to the third within 0.01%
(tests/engine/test_fp8.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data"))  # the case matrices are test data, not in the wheel

from fidelity_cases import FP8_CASES  # noqa: E402

from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

#: The traced models: the small Llama, and Llama 3.2 1B's dims with 2 layers at its real vocabulary (128,256).
MODELS = {
    "llama b2 s512": dict(FP8_CASES)["llama bf16 float8 tensorwise b2 s512"],
    "llama-3.2-1b dims L2 b2 s1024": dict(FP8_CASES)["llama-3.2-1b dims L2 bf16 float8 tensorwise b2 s1024"],
}


def scenario(model: str, mode: str) -> Scenario:
    """The dp=2 ZeRO-3 scenario of ``model`` (a ``MODELS`` key) in ``mode``."""
    data = {k: v for k, v in MODELS[model].items() if k != "fp8_recipe"}
    data["parallel"] = {"dp": 2, "zero": 3}
    if mode != "bf16":
        data["fp8_recipe"] = "tensorwise"
    if mode.endswith("all-gather"):
        data["fp8_all_gather"] = True
    return Scenario.from_dict(data)


def trace(mode: str, model: str = "llama b2 s512") -> object:
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
        bf16 = scenario(model, "bf16")  # the tracer runs the converter itself here, not the scenario's recipe
        return dist.trace_distributed(bf16)
    finally:
        dist.fakeify_meta = fakeify


def main() -> None:
    for model in sys.argv[1:] or list(MODELS):
        print(model)
        for mode in ("bf16", "float8", "float8+all-gather"):
            r = trace(mode, model)
            roles = {k: v for k, v in r.by_role.items() if v}  # type: ignore[attr-defined]
            eng = estimate(scenario(model, mode)).peak_tensor_bytes
            print(f"  {mode:18s} peak {r.peak_bytes:>14,} ({r.peak_phase})  engine {eng:>14,} "  # type: ignore[attr-defined]
                  f"({eng / r.peak_bytes - 1:+.2%})  step-2 optimizer {r.phase_peaks['2/optimizer_step']:>13,}  "  # type: ignore[attr-defined]
                  f"{roles}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
