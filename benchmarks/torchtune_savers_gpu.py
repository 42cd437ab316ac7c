"""torchtune's activation offloading and optimizer in backward on a real GPU, against the engine and the CPU trace.

Runs torchtune's own ``OffloadActivations`` and ``NoOpManager`` (its ``torchtune/training/_activation_offloading.py``
loaded from the torchtune 0.6.1 wheel given by ``--wheel``, its imports of torchao and torchtune.modules stubbed:
they only name NF4Tensor and TiedLinear) around a transformers Llama step built from a config (random weights,
``memsim_widget.measure.build_model``), and torchtune's optimizer-in-backward hooks (``register_optim_in_bwd_hooks``:
``step()`` then ``zero_grad()`` per parameter, written out here because ``torchtune/training/memory.py`` imports
torchtune's device utilities). The head is wrapped in ``NoOpManager`` from its pre-hook until the forward returns,
as trace/torchtune_memory.py does (torchtune's recipes compute the loss outside the context).

Prints, per scenario, ``torch.cuda.max_memory_allocated`` over steps 2-3 and the engine's allocated peak, and
``max_memory_reserved`` beside the engine's reserved (the replay of its stream, engine/counters/offload_stream.py;
the reserved columns untested on a GPU so far).
Needs CUDA and transformers (not torchao, bitsandbytes or torchtune installed):
    python benchmarks/torchtune_savers_gpu.py --wheel .cache/torchtune/torchtune-0.6.1-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

from memsim_widget.engine.core import estimate
from memsim_widget.measure import build_model
from memsim_widget.scenario import Scenario

GiB = 2**30
#: Llama 3.2 1B's dimensions (meta-llama/Llama-3.2-1B config.json), 8 of its 16 layers, untied head.
L32_1B_L8 = {
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 8,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
}  # fmt: skip
BASE = {
    "model": L32_1B_L8,
    "micro_batch_size": 2,
    "seq_len": 2048,
    "precision": "bf16",
    "optimizer_impl": "fused",
}
SCENARIOS = {
    "ckpt": {**BASE, "activation_checkpointing": "full"},
    "ckpt offload": {**BASE, "activation_checkpointing": "full", "activation_offloading": True},
    "ckpt opt-in-bwd": {**BASE, "activation_checkpointing": "full", "optimizer_in_backward": True},
    "ckpt offload opt-in-bwd": {**BASE, "activation_checkpointing": "full", "activation_offloading": True,
                                "optimizer_in_backward": True},
    "offload": {**BASE, "activation_offloading": True},
}  # fmt: skip


def torchtune_offloading(wheel: Path) -> types.ModuleType:
    """torchtune's ``_activation_offloading`` module from the wheel, its torchao / torchtune imports stubbed."""
    folder = Path(tempfile.mkdtemp())
    name = "torchtune/training/_activation_offloading.py"
    with zipfile.ZipFile(wheel) as z:
        z.extract(name, folder)
    nf4 = types.ModuleType("torchao.dtypes.nf4tensor")
    nf4.NF4Tensor = type("NF4Tensor", (), {})  # type: ignore[attr-defined]
    ao = types.ModuleType("torchao")
    ao.__version__ = "0.0"  # type: ignore[attr-defined]
    modules = types.ModuleType("torchtune.modules")
    modules.TiedLinear = type("TiedLinear", (), {})  # type: ignore[attr-defined]
    utils = types.ModuleType("torchtune.utils")
    utils.get_logger = lambda *_a: __import__("logging").getLogger("torchtune")  # type: ignore[attr-defined]
    for mod in (ao, types.ModuleType("torchao.dtypes"), nf4, types.ModuleType("torchtune"), modules, utils):
        sys.modules.setdefault(mod.__name__, mod)
    spec = importlib.util.spec_from_file_location("tt_offloading", folder / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(sc: Scenario, tt: types.ModuleType, steps: int = 3) -> tuple[int, int]:
    """Max allocated and max reserved bytes over steps 2 on (reserved: the cache step 1 left counts)."""
    import torch

    model, _config, _family = build_model(sc, "cuda")  # HF checkpointing on with "full", as the trace runs it
    params = [p for p in model.parameters() if p.requires_grad]
    if sc.optimizer_in_backward:
        optims = {p: torch.optim.AdamW([p], lr=1e-5, fused=True) for p in params}

        def optim_step(p: Any) -> None:
            optims[p].step()
            optims[p].zero_grad()

        for p in params:
            p.register_post_accumulate_grad_hook(optim_step)
        opt = None
    else:
        opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    head = model.get_output_embeddings()
    for step in range(1, steps + 1):
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, sc_vocab(sc), (sc.micro_batch_size, sc.seq_len), device="cuda")
        if sc.activation_offloading:
            ctx, noop, entered = tt.OffloadActivations(), tt.NoOpManager(), []

            def pre(*_a: Any, noop: Any = noop, entered: list = entered) -> None:
                if not entered:
                    noop.__enter__()
                    entered.append(True)

            handle = head.register_forward_pre_hook(pre)
            with ctx:
                out = model(input_ids=ids, labels=ids)
                if entered:
                    noop.__exit__(None, None, None)
            handle.remove()
        else:
            out = model(input_ids=ids, labels=ids)
        loss = out.loss
        del out, ids
        loss.backward()
        del loss
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def sc_vocab(sc: Scenario) -> int:
    """The scenario model's vocabulary."""
    return int(dict(sc.model)["vocab_size"]) if not isinstance(sc.model, str) else 32000


def main(argv: list[str] | None = None) -> int:
    """Measure each scenario (``--only`` names) and print it beside the engine's allocated peak."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", required=True, type=Path)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("torchtune_savers_gpu: needs CUDA", file=sys.stderr)
        return 2
    tt = torchtune_offloading(args.wheel)
    for name, data in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        sc = Scenario.from_dict({**data, "gpu": "h100-sxm-80gb"})
        est = estimate(sc)
        predicted, reserved = est.peak_allocated_bytes, est.peak_reserved_bytes
        measured, measured_reserved = run(sc, tt)
        print(f"{name:<26} measured {measured / GiB:7.3f} GiB  engine {predicted / GiB:7.3f} GiB  "
              f"error {predicted / measured - 1:+.2%}  reserved: measured {measured_reserved / GiB:7.3f} GiB  "
              f"engine {reserved / GiB:7.3f} GiB  error {reserved / measured_reserved - 1:+.2%}",
              flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
