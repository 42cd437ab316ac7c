"""GPU catalog: one record per card in ``gpus.json`` (memory as the driver reports it, names, generation,
context, workspace, speeds, price), and a custom card from a memory size.

``memory_bytes`` is what ``torch.cuda.get_device_properties().total_memory`` reports, a little less than the
label because the driver keeps some; each record says where its figure comes from (``MemorySource``; the kinds
and the sources are in gpus.json's "about" and docs/gpus.md). ``context_bytes`` is the CUDA context + kernels
resident with lazy loading on a recent driver (0.3-0.6 GiB; the Hopper cards 0.59-0.66 GiB from public readings of a
training step; older generations and CUDA 11 up to 1.3 GiB: docs/memory-facts.md#memory-outside-the-tensors).
engine/speed/gpu_speed.py reads ``GPU.speed`` and cost.py reads ``GPU.price``; a card without them (a custom size, or
one registered without them) has them unknown, and the figures made from them say so.
Add a card with ``register_gpu(GPU(...))``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError, choice_error, short_repr
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.units import GiB

MiB = 1024**2

#: GPU generations a record may name (context/workspace and the fitted matmul efficiency go by generation).
GENERATIONS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4", "custom")
#: Where a record's ``memory_bytes`` comes from (gpus.json's "about" says what each means).
MEMORY_KINDS = ("measured", "measured-sibling", "nvidia-smi", "vendor-spec", "user")
#: The dtypes a speed record may give a dense peak for (TFLOP/s).
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
_LINKS = ("hbm_gb_s", "link_gb_s", "net_gb_s", "pcie_gb_s")
#: GPUs one NVLink/xGMI domain holds when a record does not say (``speed.nvlink_domain``): a DGX/HGX node of 8.
#: Collectives over more GPUs than that cross the network (engine/speed/step_time.py).
DEFAULT_NVLINK_DOMAIN = 8


@dataclass(frozen=True)
class GPUSpeed:
    """Datasheet speeds of one card: dense 16-bit and fp32 TFLOP/s, HBM GB/s, the intra-node link
    (NVLink/xGMI, or PCIe for cards without one), the per-GPU network between nodes and the host link, GB/s
    per direction; ``peak_tflops``: every dtype's dense peak the datasheet gives, ``source``: which datasheet."""

    tflops: float
    fp32_tflops: float
    hbm_gb_s: float
    link_gb_s: float
    net_gb_s: float
    pcie_gb_s: float
    peak_tflops: tuple[tuple[str, float], ...] = ()
    source: str = ""
    nvlink_domain: int = DEFAULT_NVLINK_DOMAIN


@dataclass(frozen=True)
class Price:
    """On-demand US$ per GPU-hour, when it was so and where the figure comes from."""

    usd_per_gpu_hour: float
    date: str
    source: str


@dataclass(frozen=True)
class MemorySource:
    """Where ``memory_bytes`` comes from: ``kind`` (one of ``MEMORY_KINDS``) and the citation."""

    kind: str
    source: str


@dataclass(frozen=True)
class GPU:
    """One accelerator model; ``memory_bytes`` is what ``total_memory`` reports. ``speed`` and ``price`` None:
    unknown (figures made from them use an H100 SXM's and say so)."""

    id: str
    name: str
    memory_bytes: int
    generation: str  # one of GENERATIONS
    context_bytes: int  # CUDA/HIP context + resident kernels, outside the caching allocator
    cublas_workspace_bytes: int  # per (handle, stream) workspace, allocated through the allocator
    bf16: bool = True
    speed: GPUSpeed | None = None
    price: Price | None = None
    memory_source: MemorySource | None = None
    names: tuple[str, ...] = ()  # nvidia-smi / rocm-smi / cloud names that resolve to this card
    label_gb: float | None = None  # the marketing label (GB as the vendor prints it)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    def to_dict(self) -> dict[str, Any]:
        src = self.memory_source
        return {
            "id": self.id,
            "name": self.name,
            "memory_gib": round(self.memory_gib, 2),
            "memory_bytes": self.memory_bytes,
            "memory_source_kind": src.kind if src else "unknown",
            "memory_source": src.source if src else "",
            "label_gb": self.label_gb,
            "generation": self.generation,
            "speed_known": self.speed is not None,
            "price_per_gpu_hour": self.price.usd_per_gpu_hour if self.price else None,
            "names": list(self.names),
        }


GPUS: dict[str, GPU] = {}
#: A custom card's memory may be at most 1 PiB: every byte figure then stays far inside 64-bit integers.
MAX_MEMORY_GIB = 2**20


def _positive(field: str, value: Any, *, integer: bool = False, zero: bool = False) -> None:
    """Refuse a value that is not a positive (or, with ``zero``, non-negative) finite number."""
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (value >= 0 if zero else value > 0):
        what = "integer" if integer else "number"
        raise ScenarioError(
            field, f"must be a {'non-negative' if zero else 'positive'} {what}, got {short_repr(value)}"
        )


def _check_text(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(field, f"must be a non-empty string, got {short_repr(value)}")


def check_gpu(gpu: Any) -> GPU:
    """``gpu`` if it is a well-formed record; else one ScenarioError naming the field (``gpu.<field>``)."""
    if not isinstance(gpu, GPU):
        raise ScenarioError("gpu", f"must be a GPU(...) record, got {short_repr(gpu)}")
    _check_text("gpu.id", gpu.id)
    _check_text("gpu.name", gpu.name)
    _positive("gpu.memory_bytes", gpu.memory_bytes, integer=True)
    if gpu.memory_bytes > MAX_MEMORY_GIB * GiB:
        raise ScenarioError(
            "gpu.memory_bytes", f"must be at most {MAX_MEMORY_GIB:,} GiB, got {gpu.memory_bytes:,}"
        )
    if gpu.generation not in GENERATIONS:
        raise ScenarioError(
            "gpu.generation", f"must be one of {', '.join(GENERATIONS)}; got {short_repr(gpu.generation)}"
        )
    _positive("gpu.context_bytes", gpu.context_bytes, integer=True, zero=True)
    _positive("gpu.cublas_workspace_bytes", gpu.cublas_workspace_bytes, integer=True, zero=True)
    if gpu.speed is not None:
        if not isinstance(gpu.speed, GPUSpeed):
            raise ScenarioError(
                "gpu.speed", f"must be a GPUSpeed(...) or None (unknown), got {short_repr(gpu.speed)}"
            )
        for f in ("tflops", "fp32_tflops", *_LINKS):
            _positive(f"gpu.speed.{f}", getattr(gpu.speed, f))
        _positive("gpu.speed.nvlink_domain", gpu.speed.nvlink_domain, integer=True)
    if gpu.price is not None:
        if not isinstance(gpu.price, Price):
            raise ScenarioError(
                "gpu.price", f"must be a Price(...) or None (unknown), got {short_repr(gpu.price)}"
            )
        _positive("gpu.price.usd_per_gpu_hour", gpu.price.usd_per_gpu_hour)
    src = gpu.memory_source
    if src is not None and (not isinstance(src, MemorySource) or src.kind not in MEMORY_KINDS):
        raise ScenarioError(
            "gpu.memory_source", f"must be a MemorySource with kind one of {', '.join(MEMORY_KINDS)}"
        )
    if not isinstance(gpu.names, tuple) or not all(isinstance(n, str) and n.strip() for n in gpu.names):
        raise ScenarioError("gpu.names", f"must be a tuple of non-empty strings, got {short_repr(gpu.names)}")
    return gpu


#: Called on each ``register_gpu``: the engine's caches keyed by the scenario (whose ``gpu`` is the id) drop
#: what they computed with a record now replaced (engine/core.py registers them).
ON_REGISTER: list[Callable[[], None]] = []


def register_gpu(gpu: GPU) -> GPU:
    """Add or replace a GPU in the catalog. ``speed``/``price`` left None mark them unknown: step times and
    dollars then use an H100 SXM's figures, labelled as such (``Estimate.time_caveats``, ``cost.price_note``)."""
    GPUS[check_gpu(gpu).id] = gpu
    _EXACT_NAMES.clear()
    for clear in ON_REGISTER:
        clear()
    return gpu


def _speed(rec: Mapping[str, Any], where: str) -> GPUSpeed:
    """A record's ``speed`` table as a GPUSpeed (16-bit: bf16, else fp16)."""
    unknown = set(rec) - set(DTYPES) - set(_LINKS) - {"source", "nvlink_domain"}
    if unknown:
        raise ScenarioError(f"{where}.speed", f"unknown keys {sorted(unknown)}")
    for k in (*DTYPES, *_LINKS):
        if k in rec:
            _positive(f"{where}.speed.{k}", rec[k])
    peaks = tuple((d, float(rec[d])) for d in DTYPES if d in rec)
    domain = rec.get("nvlink_domain", DEFAULT_NVLINK_DOMAIN)
    _positive(f"{where}.speed.nvlink_domain", domain, integer=True)
    p = dict(peaks)
    try:
        links = {k: float(rec[k]) for k in _LINKS}
        return GPUSpeed(p.get("bf16", p.get("fp16", 0.0)), p.get("fp32", 0.0), links["hbm_gb_s"],
                        links["link_gb_s"], links["net_gb_s"], links["pcie_gb_s"], peaks,
                        str(rec.get("source", "")), domain)  # fmt: skip
    except KeyError as e:
        raise ScenarioError(f"{where}.speed.{e.args[0]}", "missing") from None


def _price(rec: Mapping[str, Any], where: str) -> Price:
    """A record's ``price`` table as a Price (all three of its keys required)."""
    if not isinstance(rec, Mapping) or set(rec) != {"usd_per_gpu_hour", "date", "source"}:
        raise ScenarioError(f"{where}.price", "must hold exactly usd_per_gpu_hour, date and source")
    return Price(rec["usd_per_gpu_hour"], str(rec["date"]), str(rec["source"]))


def gpu_from_record(rec: Mapping[str, Any]) -> GPU:
    """One record of gpus.json's ``gpu`` list as a checked GPU (errors name ``gpus.json[<id>].<field>``)."""
    where = f"gpus.json[{rec.get('id', '?')}]"
    try:
        mem = rec["memory"]
        gpu = GPU(
            rec["id"], rec["name"], mem["bytes"], rec["generation"], rec["context_bytes"],
            rec["cublas_workspace_bytes"], rec.get("bf16", True),
            _speed(rec["speed"], where) if "speed" in rec else None,
            _price(rec["price"], where) if "price" in rec else None,
            MemorySource(mem["kind"], mem["source"]), tuple(rec.get("names", ())), rec.get("label_gb"),
        )  # fmt: skip
    except KeyError as e:
        raise ScenarioError(f"{where}.{e.args[0]}", "missing") from None
    try:
        return check_gpu(gpu)
    except ScenarioError as e:
        raise ScenarioError(where + e.field.removeprefix("gpu"), e.message) from None


#: The catalog file shipped in the package (JSON: the standard library parses it in ~0.1 ms, tomllib in ~5 ms,
#: and every CLI start reads it; its "about" list is the header a comment would be).
CATALOG_FILE = Path(__file__).with_name("gpus.json")


def load_catalog(path: Path = CATALOG_FILE) -> list[GPU]:
    """The GPU records of a catalog file, in file order."""
    return [gpu_from_record(r) for r in json.loads(path.read_text(encoding="utf-8"))["gpu"]]


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g)\s*$", re.IGNORECASE)


#: The catalog card whose CUDA context a custom card takes: the default card, a 132-SM Hopper (0.66 GiB).
CUSTOM_CONTEXT_OF = "h100-sxm-80gb"


#: CUDA compute capability per catalog generation (its data-centre part) and the catalog cards that differ
#: (NVIDIA's CUDA GPUs list); AMD's generations have none.
_SM_OF_GENERATION = {
    "volta": (7, 0),
    "turing": (7, 5),
    "ampere": (8, 0),
    "ada": (8, 9),
    "hopper": (9, 0),
    "blackwell": (10, 0),
}
_SM_OF_CARD = {
    "a10": (8, 6),
    "a40": (8, 6),
    "rtx-3060": (8, 6),
    "rtx-3090": (8, 6),
    "rtx-a6000": (8, 6),
    "b300": (10, 3),
    "rtx-5090": (12, 0),
    "rtx-pro-6000": (12, 0),
}


def compute_capability(gpu: GPU) -> tuple[int, int] | None:
    """The card's CUDA compute capability (major, minor); None for AMD cards and custom ones."""
    return _SM_OF_CARD.get(gpu.id) or _SM_OF_GENERATION.get(gpu.generation)


def custom_gpu(memory_gib: float, name: str | None = None) -> GPU:
    """A card known only by its memory size (GiB), with Hopper-like context and workspace; its speed and price
    are unknown (``GPU.speed``/``GPU.price`` None)."""
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
    user = MemorySource("user", "the size given (GiB as typed)")
    return GPU(
        "custom",
        label,
        int(memory_gib * GiB),
        "custom",
        GPUS[CUSTOM_CONTEXT_OF].context_bytes,
        32 * MiB,
        memory_source=user,
    )


# ----- names as people type them -------------------------------------------------------------------------
# nvidia-smi, rocm-smi and cloud consoles print names such as "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB",
# "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090" or "AMD Instinct MI250X/MI250". A name is reduced to
# tokens (lower case, vendor and brand words dropped, "SXM4" -> sxm, "80 GB" -> mem:80) and matched to the
# catalog entries whose own id and name hold every token; a form factor (sxm, pcie) the entry does not
# distinguish is ignored, and a memory-type word (HBM3, GDDR6X) never decides.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "amd", "instinct", "radeon", "gpu", "graphics"}
_MEMORY_TYPE = re.compile(r"^(hbm\d*e?|gddr\d*x?)$")
_FORM_FACTORS = {"sxm", "pcie"}
#: Printed names (each record's ``names``: nvidia-smi, rocm-smi, cloud instance and accelerator names) -> id,
#: keyed by their tokens; built on first use after each ``register_gpu``.
_EXACT_NAMES: dict[frozenset[str], str] = {}


def exact_names() -> dict[frozenset[str], str]:
    """The tokens of every record's printed names, to the card's id (a later record wins a clash)."""
    if not _EXACT_NAMES:
        for gid, gpu in GPUS.items():
            for n in gpu.names:
                _EXACT_NAMES[_tokens(n)] = gid
    return _EXACT_NAMES


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
    gid = exact_names().get(typed)
    if gid is not None:
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


for _g in load_catalog():
    register_gpu(_g)
