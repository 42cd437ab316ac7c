"""GPU catalog: device memory per card, and a custom card from a memory size.

Memory sizes are the vendor's marketing figure converted to bytes as the driver reports them
(``torch.cuda.get_device_properties().total_memory`` is a little less than the label because the
driver keeps some). ``context_bytes`` is the CUDA context + kernels resident with lazy loading on a
recent driver, per docs/memory-facts.md#memory-outside-the-tensors (0.3-0.6 GiB; older generations and CUDA
11 up to 1.3 GiB).
Add a card with ``register_gpu(GPU(...))``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memsim_widget.errors import ScenarioError, choice_error, short_repr
from memsim_widget.units import GiB

MiB = 1024**2


@dataclass(frozen=True)
class GPU:
    """One accelerator model; ``memory_bytes`` is what ``total_memory`` reports."""

    id: str
    name: str
    memory_bytes: int
    generation: str  # volta | turing | ampere | ada | hopper | blackwell | cdna2 | cdna3 | custom
    context_bytes: int  # CUDA/HIP context + resident kernels, outside the caching allocator
    cublas_workspace_bytes: int  # per (handle, stream) workspace, allocated through the allocator
    bf16: bool = True

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "memory_gib": round(self.memory_gib, 2),
            "generation": self.generation,
        }


GPUS: dict[str, GPU] = {}

# cuBLAS workspace: 32 MiB per handle/stream on Hopper and newer (CUBLAS_WORKSPACE_CONFIG default
# :4096:8 = 4 MiB x 8), 4 MiB-ish on older parts (PyTorch's default for pre-Hopper is :4096:2 + :16:8).
_CTX = {
    "volta": int(0.8 * GiB),
    "turing": int(0.45 * GiB),
    "ampere": int(0.45 * GiB),
    "ada": int(0.45 * GiB),
    "hopper": int(0.5 * GiB),
    "blackwell": int(0.55 * GiB),
    "cdna2": int(0.5 * GiB),
    "cdna3": int(0.5 * GiB),
    "custom": int(0.5 * GiB),
}
_WS = {"hopper": 32 * MiB, "blackwell": 32 * MiB}


def register_gpu(gpu: GPU) -> GPU:
    """Add or replace a GPU in the catalog."""
    GPUS[gpu.id] = gpu
    return gpu


def _gpu(gid: str, name: str, gib: float, gen: str, bf16: bool = True) -> None:
    register_gpu(GPU(gid, name, int(gib * GiB), gen, _CTX[gen], _WS.get(gen, 8 * MiB), bf16))


_gpu("v100-16gb", "NVIDIA V100 16GB", 16, "volta", bf16=False)
_gpu("v100-32gb", "NVIDIA V100 32GB", 32, "volta", bf16=False)
_gpu("t4", "NVIDIA T4 16GB", 15, "turing", bf16=False)
_gpu("a10", "NVIDIA A10 24GB", 24, "ampere")
_gpu("l4", "NVIDIA L4 24GB", 24, "ada")
_gpu("l40s", "NVIDIA L40S 48GB", 48, "ada")
_gpu("a100-40gb", "NVIDIA A100 40GB", 40, "ampere")
_gpu("a100-80gb", "NVIDIA A100 80GB", 80, "ampere")
_gpu("h100-pcie-80gb", "NVIDIA H100 PCIe 80GB", 80, "hopper")
_gpu("h100-sxm-80gb", "NVIDIA H100 SXM 80GB", 80, "hopper")
_gpu("h200", "NVIDIA H200 141GB", 141, "hopper")
_gpu("b200", "NVIDIA B200 180GB", 180, "blackwell")
_gpu("rtx-3090", "NVIDIA GeForce RTX 3090 24GB", 24, "ampere")
_gpu("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 24, "ada")
_gpu("rtx-5090", "NVIDIA GeForce RTX 5090 32GB", 32, "blackwell")
_gpu("rtx-a6000", "NVIDIA RTX A6000 48GB", 48, "ampere")
_gpu("mi250x", "AMD Instinct MI250X (one GCD, 64GB)", 64, "cdna2")
_gpu("mi300x", "AMD Instinct MI300X 192GB", 192, "cdna3")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g)\s*$", re.IGNORECASE)
#: A custom card's memory may be at most 1 PiB: every byte figure then stays far inside 64-bit integers.
MAX_MEMORY_GIB = 2**20


def custom_gpu(memory_gib: float, name: str | None = None) -> GPU:
    """A card known only by its memory size (GiB), with Hopper-like context and workspace."""
    if (
        not isinstance(memory_gib, (int, float))
        or isinstance(memory_gib, bool)
        or not 0 < memory_gib <= MAX_MEMORY_GIB  # also refuses NaN and infinity
    ):
        raise ScenarioError(
            "gpu.memory_gib",
            f"must be a positive number of GiB up to {MAX_MEMORY_GIB:,}, got {short_repr(memory_gib)}",
        )
    if name is not None and not isinstance(name, str):
        raise ScenarioError("gpu.name", f"must be a string, got {short_repr(name)}")
    label = name or f"custom {memory_gib:g} GiB"
    return GPU("custom", label, int(memory_gib * GiB), "custom", _CTX["custom"], 32 * MiB)


# ----- names as people type them -------------------------------------------------------------------------
# nvidia-smi, rocm-smi and cloud consoles print names such as "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB",
# "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090" or "AMD Instinct MI250X/MI250". A name is reduced to
# tokens (lower case, vendor and brand words dropped, "SXM4" -> sxm, "80 GB" -> mem:80) and matched to the
# catalog entries whose own id and name hold every token; a form factor (sxm, pcie) the entry does not
# distinguish is ignored, and a memory-type word (HBM3, GDDR6X) never decides.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "amd", "instinct", "radeon", "gpu", "graphics"}
_MEMORY_TYPE = re.compile(r"^(hbm\d*e?|gddr\d*x?)$")
_FORM_FACTORS = {"sxm", "pcie"}
#: Printed names that the tokens alone leave ambiguous: nvidia-smi calls the H100 SXM5 "H100 80GB HBM3"
#: (the PCIe card prints "H100 PCIe"); rocm-smi prints "MI250X/MI250" for one MI250X GCD.
_PRINTED_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
    "H100 HBM3": "h100-sxm-80gb",
    "AMD Instinct MI250X/MI250": "mi250x",
}


def _tokens(text: str) -> frozenset[str]:
    """The words of a GPU name that identify the card (see the comment above)."""
    t = text.lower().replace("pci-e", "pcie").replace("pci express", "pcie")
    words = [w for w in re.split(r"[^a-z0-9.]+", t) if w]
    out: set[str] = set()
    i = 0
    while i < len(words):
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if re.fullmatch(r"\d+(\.\d+)?", w) and nxt in ("gb", "gib", "g"):
            out.add(f"mem:{float(w):g}")
            i += 2
            continue
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(gb|gib|g)", w)
        rtx = re.fullmatch(r"rtx(\d{4})", w)
        if m:
            out.add(f"mem:{float(m.group(1)):g}")
        elif rtx:
            out.update(("rtx", rtx.group(1)))
        elif re.fullmatch(r"sxm\d*", w):
            out.add("sxm")
        elif w not in _VENDOR_WORDS:
            out.add(w)
        i += 1
    return frozenset(out)


def _matches(typed: frozenset[str]) -> list[str]:
    """Catalog ids whose id and name hold every typed token (form factors the entry lacks ignored)."""
    typed = frozenset(w for w in typed if not _MEMORY_TYPE.match(w))
    found = []
    for gid, gpu in GPUS.items():
        own = _tokens(gid.replace("-", " ")) | _tokens(gpu.name)
        need = typed if own & _FORM_FACTORS else typed - _FORM_FACTORS
        if need and need <= own:
            found.append(gid)
    return found


def canonical_gpu_id(spec: str) -> str | None:
    """The catalog id a typed GPU name stands for (``"NVIDIA A100-SXM4-80GB"`` -> ``"a100-80gb"``), or None
    when it names no catalog card or several (``resolve_gpu`` then says which)."""
    if spec in GPUS:
        return spec
    if len(spec) > 200 or _SIZE.match(spec):
        return None
    typed = _tokens(spec)
    for printed, gid in _PRINTED_NAMES.items():
        if typed == _tokens(printed) and gid in GPUS:
            return gid
    found = _matches(typed)
    return found[0] if len(found) == 1 else None


def resolve_gpu(spec: str | dict[str, Any] | GPU) -> GPU:
    """A catalog id or a name as nvidia-smi prints it, a size string like ``"24GiB"``, or
    ``{"memory_gib": 24, "name": ...}``."""
    if isinstance(spec, GPU):
        return spec
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"memory_gib", "name", "id"}
        if unknown:
            raise ScenarioError(
                "gpu", f"unknown keys {short_repr(sorted(map(str, unknown)))}; allowed: memory_gib, name"
            )
        if "memory_gib" not in spec:
            gid = spec.get("id")
            if isinstance(gid, str) and gid in GPUS:
                return GPUS[gid]
            raise ScenarioError("gpu.memory_gib", "a custom GPU needs memory_gib")
        return custom_gpu(spec["memory_gib"], spec.get("name"))
    if not isinstance(spec, str):
        raise ScenarioError("gpu", f"must be a GPU id or {{'memory_gib': N}}, got {short_repr(spec)}")
    if spec in GPUS:
        return GPUS[spec]
    m = _SIZE.match(spec)
    if m:
        return custom_gpu(float(m.group(1)))
    gid = canonical_gpu_id(spec)
    if gid is not None:
        return GPUS[gid]
    several = _matches(_tokens(spec)) if len(spec) <= 200 else []
    if len(several) > 1:
        raise ScenarioError(
            "gpu",
            f"{short_repr(spec)} could be any of {', '.join(several)}; did you mean "
            f"{' or '.join(repr(g) for g in several)}? (give the id, or add SXM/PCIe and the memory size)",
        )
    raise choice_error("gpu", spec, list(GPUS) + ["<N>GiB"])
