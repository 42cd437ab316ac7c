"""What Inductor's partitioner saves for a compiled HF ViT step on FAKE CUDA tensors, on a CPU-only torch build.

Why (issue 26): the compiled ViT-B on an H200 (torch 2.11+cu130, transformers 5.17) allocated 15% more than eager,
while the CPU trace of the compiled step (trace/compiled.py: fake CPU tensors) saves less than eager. This script
traces the same step with ``cuda`` fake tensors, so that every device-dependent path of torch runs as on a GPU:
CUDA autocast's op lists (the ``AutocastCUDA`` dispatch key), SDPA's CUDA composite, Inductor's decompositions
and joint-graph passes for a CUDA graph, and the min-cut partitioner on a CUDA joint graph.

How: a CPU-only torch build cannot run autograd on ``cuda`` fakes (no CUDA device guard: "PyTorch is not linked
with support for cuda devices"; no accelerator for the autograd engine's streams: "Cannot access accelerator device
when none is available"). A 20-line C++ library (built here with g++ against the wheel's headers) registers c10's
own no-op ``FakeGuardImpl`` for CUDA and replaces ``at::detail::getCUDAHooks`` by hooks that say a CUDA device is
built and present (``at::accelerator::getAccelerator`` reads ``isBuilt``, torch 2.13.0
``aten/src/ATen/DeviceAccelerator.cpp``); the script re-runs itself with it in ``LD_PRELOAD``. No kernel ever runs:
fake tensors only carry metadata. CUDA autocast is switched on through ``torch.set_autocast_enabled("cuda")``
(``torch.autocast("cuda")`` refuses without a device).

SDPA's kernel: on this build ``scaled_dot_product_attention`` has no CUDA backend chooser, so its CUDA composite
always takes the math path. ``--sdpa math`` keeps it (what CUDA runs when every fused kernel refuses the inputs);
``--sdpa cudnn|flash|efficient`` calls that kernel's op instead, as CUDA's chooser would (a boolean mask made
additive first, as the composite does).

``--mask-517``: HF's bidirectional mask as transformers 5.17 (the H200 runs') builds it under ``torch.compile``:
``masking_utils._ignore_bidirectional_mask_sdpa`` declines to skip the mask whenever ``is_tracing`` holds, so a
compiled ViT gets an all-visible (b, 1, s, s) boolean mask, an expand of a (1, 1, s, 1) column: last-dim stride 0
(transformers issue 48925; 5.24, the project's, skips it when no padding mask is given). With transformers 5.17
installed the flag is not needed. CUDA's fused kernels all refuse a mask whose last dim has stride != 1
(``check_last_dim_stride_equals_1_dense``, torch 2.13.0 ``ATen/native/transformers/sdp_utils_cpp.h``: "GPU
backends require attn_mask's last dimension to have stride 1 while the CPU does not"), so CUDA runs the math
composite, which saves fp32 (b, heads, s, s) scores per layer: what `--sdpa math --mask-517` shows.

Run: python benchmarks/compiled_fake_cuda.py [--device cuda|cpu] [--sdpa math|cudnn|flash|efficient]
     [--mask-517] [--layers 2] [--batch 8] [--partition mincut|inductor] [--json]
(about 20 s at 2 layers on one core). Needs g++ for ``--device cuda``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

_CPP = r"""
#include <c10/core/impl/FakeGuardImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/detail/CUDAHooksInterface.h>
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
namespace at {
namespace {
struct FakeCUDAHooks : CUDAHooksInterface {
  FakeCUDAHooks() = default;
  bool hasCUDA() const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex current_device() const override { return 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void*) const override { return false; }
};
}  // namespace
namespace detail {
const CUDAHooksInterface& getCUDAHooks() { static FakeCUDAHooks hooks; return hooks; }
}  // namespace detail
}  // namespace at
"""


def fake_cuda_library() -> Path:
    """Build (once, cached beside the torch version) the preload library that lets autograd run on cuda fakes."""
    import torch

    root = Path(torch.__file__).parent
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "memsim"
        / f"fakecuda-{torch.__version__}"
    )
    lib = cache / "libfakecuda.so"
    if lib.exists():
        return lib
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / "fakecuda.cpp"
    src.write_text(_CPP)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    subprocess.run(
        ["g++", "-O1", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
         f"-I{root / 'include'}", str(src), f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu",
         f"-Wl,-rpath,{root / 'lib'}", "-o", str(lib)],
        check=True,
    )  # fmt: skip
    return lib


def _graph_name(node: Any) -> str:
    """module path (layer index -> N) : op."""
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else "(top)"
    for i in range(100):
        path = path.replace(f".{i}.", ".N.")
    t = node.target
    op = getattr(getattr(t, "overloadpacket", None), "__name__", None) or getattr(t, "__name__", str(t))
    return f"{path}:{op}"


class _Kernels:
    """A torch-function mode (built lazily: torch is imported after the re-exec) that sends SDPA to one CUDA kernel's
    op, as CUDA's backend chooser would; ``math`` leaves the composite (the CUDA build's math path here)."""

    def __new__(cls, sdpa: str) -> Any:
        import torch
        import torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        class Mode(TorchFunctionMode):
            masks: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

            def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                if func is not F.scaled_dot_product_attention:
                    return func(*args, **kwargs)
                q, k, v = args[:3]
                m = kwargs.get("attn_mask")
                if m is not None:
                    self.masks.append((tuple(m.shape), tuple(m.stride())))
                if sdpa == "math":
                    return func(*args, **kwargs)
                scale = kwargs.get("scale")
                bias = None
                if m is not None and m.dtype == torch.bool:  # convert_boolean_attn_mask
                    zero = torch.scalar_tensor(0.0, dtype=q.dtype, device=m.device)
                    bias = torch.where(m.logical_not(), float("-inf"), zero)
                ops = torch.ops.aten
                if sdpa == "cudnn":
                    return ops._scaled_dot_product_cudnn_attention(
                        q, k, v, bias, True, 0.0, False, False, scale=scale
                    )[0]
                if sdpa == "flash":
                    return ops._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)[0]
                from memsim_widget.trace.cuda_sdpa import _efficient_bias

                eb = _efficient_bias(bias, q, k)
                return ops._scaled_dot_product_efficient_attention(
                    q, k, v, eb, True, 0.0, False, scale=scale
                )[0]

        return Mode()


def _mask_517() -> contextlib.AbstractContextManager:
    """transformers 5.17's skip rule for the bidirectional mask (module docstring): never skipped while tracing."""
    from unittest import mock

    import transformers.masking_utils as mu
    from transformers.utils.import_utils import is_tracing

    orig = mu._ignore_bidirectional_mask_sdpa

    def as_517(padding_mask: Any, kv_length: int, local_attention_size: int | None = None) -> bool:
        if is_tracing(padding_mask):
            return False
        return orig(padding_mask, kv_length, local_attention_size)

    return mock.patch.object(mu, "_ignore_bidirectional_mask_sdpa", as_517)


def trace(device: str, sdpa: str, layers: int, batch: int, partition: str, mask_517: bool) -> dict[str, Any]:
    """The forward graphs' saved tensors of one compiled amp-bf16 ViT-B (``layers`` layers) step."""
    import torch
    import torch.fx
    import transformers
    from torch._subclasses import FakeTensorMode

    from memsim_widget.trace.cuda_autocast import cuda_fp32_ops_when_autocast
    from memsim_widget.trace.run import fakeify_meta

    graphs: list[torch.fx.GraphModule] = []

    def runner(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)

        def run(args: list[Any]) -> Any:
            return torch.fx.Interpreter(gm).boxed_run(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    kernels = _Kernels(sdpa)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._guards import detect_fake_mode
        from torch._inductor.virtualized import V

        part: Any = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
        if (
            partition == "inductor"
        ):  # Inductor's joint-graph passes first; its constant folder runs real kernels
            jg = import_module("torch._inductor.fx_passes.joint_graph")
            fold = jg.constant_fold_uniform_value
            jg.constant_fold_uniform_value = lambda g: _try(fold, g)
            part = import_module("torch._inductor.compile_fx").partition_fn
        with contextlib.ExitStack() as st:
            st.enter_context(kernels)
            if device == "cpu":
                st.enter_context(cuda_fp32_ops_when_autocast())
            st.enter_context(V.set_fake_mode(detect_fake_mode(example_inputs)))
            decomp = import_module("torch._inductor.compile_fx").select_decomp_table
            return aot_autograd(fw_compiler=runner, bw_compiler=runner, decompositions=decomp,
                                partition_fn=part)(gm, example_inputs)  # fmt: skip

    torch.autograd.set_multithreading_enabled(False)
    cfg = transformers.ViTConfig(num_hidden_layers=layers, num_labels=1000, attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.ViTForImageClassification(cfg)
    with FakeTensorMode(allow_non_fake_inputs=False), _mask_517() if mask_517 else contextlib.nullcontext():
        fakeify_meta(model, device)
        model.train()
        compiled = torch.compile(model, backend=backend)
        px = torch.randn(batch, 3, 224, 224, device=device)
        labels = torch.randint(0, 1000, (batch,), device=device)
        if device == "cuda":
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", torch.bfloat16)
            compiled(pixel_values=px, labels=labels)
            torch.set_autocast_enabled("cuda", False)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                compiled(pixel_values=px, labels=labels)
    fw = [
        g
        for g in graphs
        if not any(p.name.startswith("tangents") for p in g.graph.find_nodes(op="placeholder"))
    ]
    saved = []
    for gm in fw:
        out_node = next(iter(gm.graph.find_nodes(op="output")))
        for n in out_node.args[0]:
            v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
            if isinstance(v, torch.Tensor):
                saved.append({"where": _graph_name(n), "shape": list(v.shape), "stride": list(v.stride()),
                              "dtype": str(v.dtype).replace("torch.", ""), "bytes": v.numel() * v.element_size()})  # fmt: skip
    return {"transformers": transformers.__version__, "torch": torch.__version__, "device": device, "sdpa": sdpa,
            "layers": layers, "batch": batch, "tokens": batch * 197, "forward_graphs": len(fw),
            "masks": [list(map(list, m)) for m in kernels.masks], "saved": saved}  # fmt: skip


def _try(fn: Any, gm: Any) -> Any:
    """Inductor's ``constant_fold_uniform_value`` computes constants with real kernels, which cuda fakes lack."""
    try:
        return fn(gm)
    except NotImplementedError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--sdpa", choices=["math", "cudnn", "flash", "efficient"], default="math")
    ap.add_argument(
        "--mask-517", action="store_true", help="transformers 5.17's bidirectional mask under compile"
    )
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--partition", choices=["mincut", "inductor"], default="mincut")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cuda" and "libfakecuda" not in os.environ.get("LD_PRELOAD", ""):
        lib = fake_cuda_library()
        env = {**os.environ, "LD_PRELOAD": f"{lib} {os.environ.get('LD_PRELOAD', '')}".strip()}
        return subprocess.run([sys.executable, *sys.argv], env=env, check=False).returncode
    r = trace(args.device, args.sdpa, args.layers, args.batch, args.partition, args.mask_517)
    if args.json:
        print("RESULT " + json.dumps(r))
        return 0
    T = r["tokens"]
    print(f"torch {r['torch']}, transformers {r['transformers']}, {r['device']} fakes, SDPA {r['sdpa']}, "
          f"{r['layers']} layers, T = {T}, forward graphs: {r['forward_graphs']}, SDPA masks (shape, stride): "
          f"{r['masks'][:1]}")  # fmt: skip
    agg: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])
    for s in r["saved"]:
        key = (s["where"], tuple(s["shape"]), tuple(s["stride"]), s["dtype"])
        agg[key][0] += 1
        agg[key][1] += s["bytes"]
    print(f"saved for backward: {sum(s['bytes'] for s in r['saved']):,} B")
    for (where, shape, stride, dt), (count, nbytes) in sorted(agg.items()):
        print(f"{count:3d} x {where:<66} {shape!s:<20} {stride!s:<24} {dt:<9} {nbytes:>12,} "
              f"{nbytes / count / T:8.1f} B/token")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
