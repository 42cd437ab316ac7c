"""Run torch DistributedDataParallel for real on the CPU (gloo, world size 1) under a logging dispatch mode and
hold the engine's DDP stream (``engine/counters/ddp_stream.py``) to it.

The Reducer's bucket tensors come from C++ ``at::empty`` and the wrap-time broadcast's flat buffers from
``torch.cat`` (``flatten_dense_tensors``); both pass the dispatcher on the calling thread, so a Python
``TorchDispatchMode`` sees them (on the CPU the autograd engine runs backward on the calling thread too).
Frees are read from weak references to each storage, swept before every op; bf16 matrix products are computed
in fp32 and rounded (``cpu_products``: the same storages, many times faster on an AVX2 CPU). Printed per case:

- the buckets DDP reports at wrap (``_get_ddp_logging_data``'s ``bucket_sizes``) and those the rebuild
  allocates at the second forward beside ``ddp_stream.rank_buckets`` of the same model as an engine scenario;
- the storages made between DDP's constructor call and its return, and between the second step's first
  forward call and the model's first op (the rebuild), in order, beside the stream's;
- the traced run replayed through the caching allocator with and without the DDP wrapper (the same steps, CPU
  ops, not CUDA's kernels), and the engine's stream replayed with and without DDP: what DDP adds to reserved.

    python benchmarks/ddp_trace.py            # both find_unused_parameters settings
    python benchmarks/ddp_trace.py --lora     # peft LoRA (rank 64, every Linear), the base frozen
    python benchmarks/ddp_trace.py --lora --bf16   # the same over a bf16 base (peft's adapters fp32)
    python benchmarks/ddp_trace.py --qlora    # QLoRA: the layers' Linears bitsandbytes NF4 (bf16 compute)

``--qlora`` needs bitsandbytes (0.50.2 runs its 4-bit layers on the CPU with real tensors; ``scripts/dev``).

Needs the ``[trace]`` extra (torch, transformers); no network (the model is built from its config).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))

import cpu_products  # noqa: E402
from fidelity_cases import LLAMA_H512_V32K  # noqa: E402

from memsim_widget.engine.counters.allocator import FREE, CachingAllocator  # noqa: E402

STEPS = 2
BATCH, SEQ = 2, 512
#: peft's targets for the LoRA case: every Linear of the layers (the engine's ``all-linear``)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
#: the LoRA case's rank: its adapters (9.4 MB) fill the 1 MiB first bucket and a second one
LORA_RANK = 64


def quantise(model: Any) -> list[Any]:
    """QLoRA's base as transformers' bitsandbytes integration makes it (``load_in_4bit``, NF4, double
    quantisation, bf16 compute, uint8 storage): every Linear of the decoder layers replaced by a
    ``bitsandbytes.nn.Linear4bit`` whose ``Params4bit`` is quantised by ``.to("cpu")``, the head and embeddings
    left in bf16 (``llm_int8_skip_modules``); ``is_loaded_in_4bit`` set so that peft wraps them with its
    ``lora.bnb.Linear4bit``. Returns the quantisation states' tensors (absmax, nested absmax and codes: no
    parameters, so DDP never sees them)."""
    import bitsandbytes as bnb
    import torch

    states: dict[int, Any] = {}
    for layer in model.model.layers:
        for mod in list(layer.modules()):
            for name, child in list(mod.named_children()):
                if not isinstance(child, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(
                    child.in_features, child.out_features, bias=child.bias is not None,
                    compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                    quant_storage=torch.uint8,
                )  # fmt: skip
                q.weight = bnb.nn.Params4bit(
                    child.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4"
                )
                q = q.to("cpu")
                setattr(mod, name, q)
                qs = q.weight.quant_state
                for t in (qs.absmax, qs.code, qs.state2.absmax, qs.state2.code, qs.offset):
                    states.setdefault(t.untyped_storage().data_ptr(), t)
    model.is_loaded_in_4bit = True
    return list(states.values())


def traced_run(
    find_unused: bool | None,
    port: int,
    lora: int = 0,
    bf16: bool = False,
    qlora: bool = False,
    model_config: dict[str, Any] | None = None,
    seq: int = SEQ,
) -> dict[str, Any]:
    """Two training steps of the Llama of ``LLAMA_H512_V32K`` (fp32, AdamW, foreach) wrapped in DDP with
    ``find_unused`` (None: not wrapped); ``lora``: peft LoRA of that rank on every Linear but the head (fp32
    adapters, the base frozen; ``bf16``: the base in bf16, peft's adapters fp32 as it casts them by default;
    ``qlora``: the layers' Linears in NF4 besides, ``quantise``; ``model_config``: another Llama config,
    ``seq``: another length); the allocation events, DDP's own ones and its bucket sizes."""
    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import LlamaConfig, LlamaForCausalLM

    events: list[tuple[int, int, int]] = []
    live: dict[int, tuple[Any, int]] = {}
    counter = [0]
    marks: dict[str, int] = {}

    def sweep() -> None:
        for key, (ref, handle) in list(live.items()):
            if ref.expired():
                events.append((handle, FREE, 0))
                del live[key]

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            sweep()
            marks.setdefault("first op after", len(events))
            out = cpu_products.call(func, args, kwargs or {})
            for o in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(o, torch.Tensor):
                    st = o.untyped_storage()
                    key = st.data_ptr()
                    if st.nbytes() and key not in live and func is not torch.ops.aten.detach.default:
                        counter[0] += 1
                        live[key] = (StorageWeakRef(st), counter[0])
                        events.append((counter[0], st.nbytes(), 0))
            return out

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.manual_seed(0)
    cfg = {k: v for k, v in (model_config or LLAMA_H512_V32K).items() if k != "model_type"}
    with torch.device("cpu"):
        model = LlamaForCausalLM(LlamaConfig(**cfg, use_cache=False))
        if bf16 or qlora:
            model = model.to(torch.bfloat16)
        quant_states = quantise(model) if qlora else []
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora, target_modules=LORA_TARGETS, lora_dropout=0.0))
    inner = model.get_base_model() if lora else model
    mode = Log()
    mode.__enter__()
    for p in [*model.parameters(), *quant_states]:  # the weights in module order, as the stream writes them
        counter[0] += 1
        live[p.untyped_storage().data_ptr()] = (StorageWeakRef(p.untyped_storage()), counter[0])
        events.append((counter[0], p.untyped_storage().nbytes(), 0))
    wrapped: Any = model
    data: dict[str, Any] = {"weights": len(events)}
    if find_unused is not None:
        dist.init_process_group("gloo", rank=0, world_size=1)
        at = len(events)
        wrapped = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused)
        sweep()
        data["wrap"] = events[at:]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    ids = torch.randint(0, cfg["vocab_size"], (BATCH, seq))
    for step in range(1, STEPS + 1):
        at = len(events)
        marks.pop("first op after", None)
        if step == 2 and find_unused is not None:
            # the rebuild: between DDP's forward call and the model's first op (the embedding lookup)
            hook = inner.model.embed_tokens.register_forward_pre_hook(
                lambda *_: marks.__setitem__("rebuild end", len(events))
            )
        loss = wrapped(input_ids=ids, labels=ids).loss
        if step == 2 and find_unused is not None:
            hook.remove()
            data["rebuild"] = events[at : marks["rebuild end"]]
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)
        sweep()
    mode.__exit__(None, None, None)
    if find_unused is not None:
        log = wrapped._get_ddp_logging_data()
        data["bucket_sizes"] = [int(x) for x in str(log.get("bucket_sizes", "")).split(",") if x]
        dist.destroy_process_group()
    data["events"] = events
    return data


def replayed(events: list[tuple[int, int, int]]) -> int:
    """Peak reserved of ``events`` through the caching allocator (PyTorch's defaults)."""
    a = CachingAllocator(None)
    a.run(events)
    return a.peak_reserved


class _Events:
    """Enough of ``alloc_stream.StreamWriter`` for ``ddp_stream.DdpWriter``: events after handle ``first``."""

    def __init__(self, first: int) -> None:
        self.events: list[tuple[int, int, int]] = []
        self.handle = first

    def alloc(self, size: int) -> list[int]:
        self.handle += 1
        self.events.append((self.handle, size, 0))
        return [self.handle]

    def free(self, handles: list[int]) -> None:
        self.events += [(h, FREE, 0) for h in handles]


def with_engine_ddp(run: dict[str, Any], b: Any) -> int:
    """Peak reserved of the traced run without DDP (``run``) with the engine's DDP buffers (``DdpBuckets``)
    written right after its weights, as the engine's stream writes them: the engine's DDP on the real steps."""
    from memsim_widget.engine.counters.ddp_stream import DdpWriter

    events, at = run["events"], run["weights"]
    w = _Events(max(h for h, _, _ in events))
    DdpWriter(w, b).wrap()
    return replayed(events[:at] + w.events + events[at:])


def engine(find_unused: bool, lora: int = 0, bf16: bool = False, qlora: bool = False) -> dict[str, Any]:
    """The engine's DDP rank of the same model and step (fp32, AdamW foreach), its buckets and replays;
    ``lora``: LoRA of that rank on every Linear (``find_unused`` is then HF Trainer's for a peft model);
    ``qlora``: method qlora (a bf16 model)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.counters.ddp_stream import rank_buckets
    from memsim_widget.engine.frameworks import allocator_conf

    sc = {
        "model": LLAMA_H512_V32K, "micro_batch_size": BATCH, "seq_len": SEQ, "precision": "fp32",
        "optimizer": "adamw", "optimizer_impl": "foreach", "reserved_model": "replay",
        "activation_checkpointing": "none" if find_unused else "full", "parallel": {"dp": 2},
    }  # fmt: skip
    if lora:
        sc.update(
            method="lora", lora={"rank": lora, "targets": ["all-linear"]}, activation_checkpointing="none"
        )
    if bf16 or qlora:
        sc["precision"] = "bf16"
    if qlora:
        sc["method"] = "qlora"
    out: dict[str, Any] = {}
    for dp in (2, 1):
        ctx = Context(estimate({**sc, "parallel": {"dp": dp}}).scenario)
        st = ctx.stages[0]
        out[dp] = replay_stream(rank_stream(ctx, st), allocator_conf(ctx)).peak_reserved
        if dp == 2:
            b = rank_buckets(ctx, st)
            out["buckets"] = b
    return out


def main() -> None:
    """Print the comparison for ``find_unused_parameters`` True (HF Trainer without checkpointing) and False,
    and for LoRA (``--lora``: True, HF Trainer's for a peft model, which is no ``PreTrainedModel``)."""
    qlora = "--qlora" in sys.argv
    lora = LORA_RANK if "--lora" in sys.argv or qlora else 0
    bf16 = "--bf16" in sys.argv
    plain = traced_run(None, 29611, lora, bf16, qlora)
    base = replayed(plain["events"])
    for k, fu in enumerate((True,) if lora else (True, False)):
        t = traced_run(fu, 29612 + k, lora, bf16, qlora)
        e = engine(fu, lora, bf16, qlora)
        b = e["buckets"]
        wrap = [size for _, size, _ in t["wrap"] if size != FREE]
        kind = "QLoRA" if qlora else "LoRA"
        print(f"find_unused_parameters={fu}" + (f", {kind} rank {lora}" if lora else ""))
        print(
            f"  DDP's bucket_sizes at wrap {t['bucket_sizes']}; engine (allocation order) {list(b.initial)}"
        )
        rebuilt = [size for _, size, _ in t.get("rebuild", []) if size >= 2**20]
        print(f"  buckets traced at the rebuild {rebuilt}; engine {list(b.rebuilt)}")
        print(f"  traced at wrap (allocations in order): {wrap}")
        print(f"  engine at wrap: broadcast {list(b.broadcast)}, buckets {list(b.initial)}, map {b.used_map}")
        rebuild = [size if size != FREE else "free" for _, size, _ in t.get("rebuild", [])]
        print(f"  traced at the rebuild: {rebuild}")
        traced = replayed(t["events"])
        print(
            f"  trace replay reserved: DDP {traced:,} B, without {base:,} B, +{traced - base:,}; engine stream: "
            f"DDP {e[2]:,}, one GPU {e[1]:,}, +{e[2] - e[1]:,}"
        )
        if not b.rebuilt:  # the rebuild's place in the traced steps is not marked: without one only
            ours = with_engine_ddp(plain, b)
            print(f"  traced run without DDP plus the engine's DDP buffers after its weights: {ours:,} B")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
