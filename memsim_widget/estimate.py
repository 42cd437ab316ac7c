"""The result of a simulation: per-rank peaks, the breakdown at the peak, the verdict, and a tidy frame."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from memsim_widget.architecture import Architecture
from memsim_widget.catalog.gpus import GPU, resolve_gpu
from memsim_widget.engine.context import Stage
from memsim_widget.engine.items import CATEGORIES, Item, fmt_bytes
from memsim_widget.engine.time_breakdown import StepTime
from memsim_widget.engine.timeline import Moment
from memsim_widget.scenario import Scenario

if TYPE_CHECKING:
    import pandas as pd

GiB = 1024**3
#: Default share of device memory kept free: allocator variance between versions and runs
#: (REFERENCE.md: 454 Megatron runs below 80% never ran out of memory; 10% covers most reports).
DEFAULT_HEADROOM = 0.10

#: How ``mfu`` counts: model FLOPs per token over the card's dense peak.
MFU_CONVENTION = (
    "model FLOPs per token 6 N + 12 L H Q s (PaLM, arXiv 2204.02311 appendix B: N the matmul parameters a "
    "token passes through, output head included, embedding lookups not; attention without the causal halving; "
    "no recomputation; LoRA counted as full training) x tokens/s per GPU / dense 16-bit peak (fp32 peak for fp32)"
)

COUNTERS = {
    "peak_tensor_bytes": "live tensor bytes (PyTorch dispatch level, a fake-tensor trace)",
    "peak_allocated_bytes": "torch.cuda.max_memory_allocated()",
    "peak_reserved_bytes": "torch.cuda.max_memory_reserved()",
    "device_total_bytes": "what nvidia-smi shows for the process",
}


@dataclass(frozen=True)
class RankEstimate:
    """One rank (one per pipeline stage; ranks within a stage are symmetric)."""

    stage: Stage
    moments: tuple[Moment, ...]
    peak: Moment
    reserved: Item
    device: tuple[Item, ...]
    host: tuple[Item, ...]
    step1_peak_allocated_bytes: int
    params_local: int
    trainable_local: int
    #: (counter, (low, high)) uncertainty bands of the three GPU counters (engine/overhead.counter_bands)
    bands: tuple[tuple[str, tuple[int, int]], ...] = ()

    @property
    def label(self) -> str:
        return self.stage.label

    @property
    def peak_phase(self) -> str:
        return self.peak.name

    @property
    def peak_tensor_bytes(self) -> int:
        return max(m.tensor_bytes for m in self.moments)

    @property
    def peak_allocated_bytes(self) -> int:
        return self.peak.allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self.peak_allocated_bytes + self.reserved.bytes

    @property
    def device_total_bytes(self) -> int:
        return self.peak_reserved_bytes + sum(i.bytes for i in self.device)

    @property
    def host_bytes(self) -> int:
        return sum(i.bytes for i in self.host)

    @property
    def items(self) -> tuple[Item, ...]:
        """Everything on the device at the peak, including reserved and outside-PyTorch memory."""
        return self.peak.items + (self.reserved,) + self.device

    def components(self) -> dict[str, int]:
        """Bytes per category at the peak (device total split; temporaries kept apart)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for i in self.items:
            out[i.category] += i.allocated_bytes if i.level in ("tensor", "allocator") else i.bytes
        return out

    def moment_totals(self) -> dict[str, int]:
        return {m.name: m.allocated_bytes for m in self.moments}

    def phase_peaks(self) -> dict[str, Moment]:
        """The highest moment of each phase (``training``, and ``rollout`` for GRPO/PPO): the rank's peak is
        the larger of the two (``engine/objectives.phase_of``)."""
        from memsim_widget.engine.objectives import phase_of

        out: dict[str, Moment] = {}
        for m in self.moments:
            p = phase_of(m.name)
            if p not in out or m.allocated_bytes > out[p].allocated_bytes:
                out[p] = m
        return out

    def uncertainty(self) -> dict[str, dict[str, int]]:
        """Low and high bytes per GPU counter (what runs of this configuration can plausibly show)."""
        return {name: {"low": lo, "high": hi} for name, (lo, hi) in self.bands}


@dataclass(frozen=True)
class Estimate:
    """The simulated memory of one training step, per rank, with the peak and its breakdown."""

    scenario: Scenario
    arch: Architecture
    gpu: GPU
    ranks: tuple[RankEstimate, ...]
    trainable_parameters: int

    # ----- headline numbers (worst rank) --------------------------------------------------------
    @cached_property
    def worst(self) -> RankEstimate:
        return max(self.ranks, key=lambda r: r.device_total_bytes)

    @property
    def peak_tensor_bytes(self) -> int:
        return self.worst.peak_tensor_bytes

    @property
    def peak_allocated_bytes(self) -> int:
        return self.worst.peak_allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self.worst.peak_reserved_bytes

    @property
    def device_total_bytes(self) -> int:
        return self.worst.device_total_bytes

    @property
    def peak_phase(self) -> str:
        return self.worst.peak_phase

    @property
    def attention(self) -> dict[str, str]:
        """The attention kernel the numbers assume: the scenario's, or what transformers runs instead (Gemma 2 has
        no SDPA path and runs eager), with the reason when they differ."""
        requested = self.scenario.attention
        used = self.arch.attention_kernel(requested)
        out = {"requested": requested, "used": used}
        if used != requested:
            out["why"] = str(self.arch.extra.get("attention_note", ""))
        return out

    @property
    def parameters(self) -> int:
        return self.arch.parameters

    def components(self) -> dict[str, int]:
        return self.worst.components()

    def uncertainty(self) -> dict[str, dict[str, int]]:
        """Low and high bytes of ``peak_allocated_bytes``, ``peak_reserved_bytes`` and ``device_total_bytes``
        on the worst rank (engine/overhead.counter_bands says how each band is made)."""
        return self.worst.uncertainty()

    # ----- verdict ------------------------------------------------------------------------------
    def fits(self, gpu: GPU | str | dict | None = None, headroom: float = DEFAULT_HEADROOM) -> bool:
        """True if the worst rank's nvidia-smi total stays under (1 - headroom) of the GPU's memory."""
        card = self.gpu if gpu is None else resolve_gpu(gpu)
        return self.device_total_bytes <= card.memory_bytes * (1 - headroom)

    def verdict(self, headroom: float = DEFAULT_HEADROOM) -> str:
        """``fits``, ``tight`` (inside the card but within the headroom band) or ``does not fit``."""
        if self.fits(headroom=headroom):
            return "fits"
        return "tight" if self.device_total_bytes <= self.gpu.memory_bytes else "does not fit"

    def recommended_memory_bytes(self, headroom: float = DEFAULT_HEADROOM) -> int:
        """Smallest device memory that holds the peak with ``headroom`` to spare."""
        return int(self.device_total_bytes / (1 - headroom))

    def bottleneck(self, top: int = 3) -> dict[str, Any]:
        """The category and the items that dominate the worst rank at its peak, and the moment."""
        comps = self.components()
        cat = max(comps, key=comps.get)  # type: ignore[arg-type]
        items = sorted((i for i in self.worst.items if i.category == cat), key=lambda i: -i.bytes)[:top]
        return {
            "rank": self.worst.label,
            "moment": self.peak_phase,
            "category": cat,
            "bytes": comps[cat],
            "share": comps[cat] / max(self.device_total_bytes, 1),
            "items": [{"item": i.item, "bytes": i.bytes, "formula": i.formula} for i in items],
        }

    def role(self, rank: RankEstimate) -> str:
        """What ``rank`` holds, in words (its stage's layers and ends, how the layout splits them)."""
        from memsim_widget.rank_roles import rank_role

        return rank_role(self.scenario, rank.stage, self.arch.num_layers)

    # ----- time ---------------------------------------------------------------------------------
    @cached_property
    def time(self) -> StepTime:
        """The modelled step time and where it goes (computed on first use, so ``estimate`` stays fast)."""
        from memsim_widget.engine.context import Context
        from memsim_widget.engine.objectives import training_scenario
        from memsim_widget.engine.time_breakdown import step_time

        # an objective's step runs the SFT step's kernels on its sequences (its reference forward and the
        # rollout phase are not timed)
        return step_time(Context(training_scenario(self.scenario)))

    @property
    def step_time_s(self) -> float:
        """Modelled seconds per optimizer step (all micro-batches, the slowest pipeline stage)."""
        return self.time.step_time_s

    @property
    def tokens_per_second_per_gpu(self) -> float:
        """Modelled training tokens per second per GPU (global batch tokens / step time / GPUs)."""
        return self.time.tokens_per_second_per_gpu

    @property
    def mfu(self) -> float:
        """Modelled model FLOPs utilisation (``MFU_CONVENTION``)."""
        return self.time.mfu

    @property
    def time_caveats(self) -> tuple[str, ...]:
        """What the step time does not model for this scenario, in words (docs/speed.md, "Where it misses")."""
        s, out = self.scenario, []
        if s.compile:
            out.append(
                "compile: only its fusion of elementwise ops is modelled, not the eager overheads it removes"
            )
        if s.activation_offloading:
            out.append("activation offloading: its PCIe copies are assumed hidden behind compute")
        if s.method != "full":
            out.append("MFU counts full-training FLOPs (6N), as PaLM's convention does, for LoRA/QLoRA too")
        if self._tp_exposed:
            out.append("tensor-parallel collectives are counted as exposed (no --tp-comm-overlap)")
        if "paged" in s.optimizer:
            out.append("paged optimizer states moved to and from the host are not modelled")
        if self.arch.extra.get("ssm"):
            out.append(
                "state-space scan (Mamba: 9 x I x N FLOPs per token and layer, mamba's own count; Mamba-2: the SSD "
                "chunk einsums) run at attention's efficiency; no scan kernel was timed (and the torch paths are far "
                "slower)"
            )
        if self.arch.extra.get("vision"):
            out.append(
                "the vision tower's and projector's compute is not in the step time (the language model's is)"
            )
        if s.objective_name != "sft":
            out.append(
                f"objective {s.objective_name}: the training step's time on its sequences only; generation, scoring "
                "and the reference's forward are not timed"
            )
        return tuple(out)

    @property
    def _tp_exposed(self) -> bool:
        """True when tensor-parallel communication is in the step (and counted as not overlapped)."""
        from memsim_widget.engine.step_time import OVERLAPPING_FRAMEWORKS

        return self.scenario.parallel.tp > 1 and self.scenario.framework not in OVERLAPPING_FRAMEWORKS

    def time_rows(self) -> list[dict[str, Any]]:
        """Tidy rows of the step time: one per category and item, seconds, share of the step, formula."""
        step = self.step_time_s
        return [
            {
                "category": i.category,
                "item": i.item,
                "seconds": i.seconds,
                "share": i.seconds / step if step else 0.0,
                "formula": i.formula,
            }
            for i in self.time.items
            if i.seconds
        ]

    @property
    def time_frame(self) -> pd.DataFrame:
        """Where the step time goes as a pandas DataFrame (category, item, seconds, share, formula)."""
        import pandas as pd

        return pd.DataFrame(self.time_rows(), columns=["category", "item", "seconds", "share", "formula"])

    # ----- tables -------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows: one per rank, category and item at that rank's peak."""
        out = []
        for r in self.ranks:
            for i in r.items:
                counted = i.allocated_bytes if i.level in ("tensor", "allocator") else i.bytes
                out.append(
                    {
                        "rank": r.label,
                        "stage": r.stage.index,
                        "moment": r.peak_phase,
                        "category": i.category,
                        "item": i.item,
                        "bytes": counted,
                        "gib": counted / GiB,
                        "counter": i.level,
                        "formula": i.formula,
                    }
                )
        return out

    @property
    def frame(self) -> pd.DataFrame:
        """The breakdown as a pandas DataFrame (rank, stage, moment, category, item, bytes, gib, counter, formula)."""
        import pandas as pd

        df = pd.DataFrame(
            self.rows(),
            columns=["rank", "stage", "moment", "category", "item", "bytes", "gib", "counter", "formula"],
        )
        if self.calibrated:  # a calibrated model's rows say so, and the frame's attrs carry the fit
            df["source"] = "calibrated from a trace"
            df.attrs["calibration"] = self.calibration
        return df

    @property
    def calibrated(self) -> bool:
        """True when the model's activations are fitted from traces (a transformers type no family models)."""
        return self.arch.extra.get("calibration") is not None

    @property
    def calibration(self) -> dict[str, Any] | None:
        """The fit behind a calibrated model's activations (coefficients, held-out residual), else None."""
        if not self.calibrated:
            return None
        from memsim_widget.engine.calibrated import fit_for

        fit = fit_for(self.arch, self.scenario)
        return {"source": "calibrated from a trace", **{k: v for k, v in fit.items()}}

    def phases(self) -> dict[str, dict[str, Any]]:
        """Each phase's peak on the worst rank: its moment, allocated bytes and components (training; rollout
        for GRPO/PPO; a separate rollout GPU group's engine as ``rollout_group``)."""
        from memsim_widget.engine.context import Context
        from memsim_widget.engine.objectives import training_scenario
        from memsim_widget.engine.rollout import separate_group

        out: dict[str, dict[str, Any]] = {}
        for phase, m in self.worst.phase_peaks().items():
            comps = dict.fromkeys(CATEGORIES, 0)
            for i in m.items:
                comps[i.category] += i.allocated_bytes
            out[phase] = {
                "moment": m.name,
                "allocated_bytes": m.allocated_bytes,
                "peak": m.name == self.peak_phase,
                "components": {k: v for k, v in comps.items() if v},
            }
        group = separate_group(Context(training_scenario(self.scenario)), self.scenario)
        if group is not None:
            out["rollout_group"] = {
                "moment": "rollout_generate (separate GPU group)",
                "allocated_bytes": sum(group.values()),
                "peak": False,
                "items": group,
            }
        return out

    def phase_rows(self) -> list[dict[str, Any]]:
        """Tidy rows of each phase's peak moment on the worst rank (phase, moment, category, item, bytes, formula)."""
        from memsim_widget.engine.objectives import phase_of

        rows = []
        for phase, m in self.worst.phase_peaks().items():
            assert phase == phase_of(m.name)
            for i in m.items:
                if i.allocated_bytes:
                    rows.append(
                        {
                            "phase": phase,
                            "moment": m.name,
                            "category": i.category,
                            "item": i.item,
                            "bytes": i.allocated_bytes,
                            "gib": i.allocated_bytes / GiB,
                            "formula": i.formula,
                        }
                    )
        return rows

    @property
    def phase_frame(self) -> pd.DataFrame:
        """Both phases' breakdowns as a pandas DataFrame (phase, moment, category, item, bytes, gib, formula):
        the rollout phase (generation, scoring) and the training step, each at its own peak."""
        import pandas as pd

        return pd.DataFrame(
            self.phase_rows(), columns=["phase", "moment", "category", "item", "bytes", "gib", "formula"]
        )

    @property
    def caveats(self) -> tuple[str, ...]:
        """What the figures do not model, in words (shown beside the verdict: never a silent exact-looking number)."""
        out = []
        if self.calibrated:
            from memsim_widget.engine.calibrated import caveat

            out.append(caveat(self.arch, self.scenario))
        if self.scenario.compile:
            out.append(
                "compile: true has no memory rule; these are eager's figures (measured on an H200: "
                "+15% allocated on ViT-B, -23% on Llama 3.2 1B; docs/accuracy.md)"
            )
        if self.arch.extra.get("ssm"):
            if (self.scenario.ssm_kernel or "cuda") == "cuda":
                out.append(
                    "ssm_kernel cuda (the default: mamba-ssm + causal-conv1d installed): the Mamba layers' "
                    "activations are a formula from mamba-ssm's saved tensors, not traced; without those "
                    "packages transformers runs its torch path (ssm_kernel: torch), which keeps every scan state"
                )
            else:
                out.append(
                    "ssm_kernel torch: transformers' pure-PyTorch Mamba scan (no mamba-ssm), held to a CPU "
                    "fake-tensor trace; it keeps every step's state (b x I x N per token)"
                )
        obj = self.scenario.objective_name
        if obj == "ppo" and self.scenario.activation_checkpointing in ("full", "selective-op"):
            out.append(
                "objective ppo with checkpointing: TRL checkpoints the policy only; the value model's layers are "
                "taken as checkpointed too (not traced; docs/fidelity.md)"
            )
        if obj in ("grpo", "ppo") and self.scenario.rl_config.rollout != "none":
            out.append("rollout phase: formula-only, vLLM's documented arithmetic (engine/rollout.py)")
            from memsim_widget.engine.context import Context
            from memsim_widget.engine.objectives import training_scenario
            from memsim_widget.engine.rollout import engine_items

            kv = engine_items(Context(training_scenario(self.scenario)), self.scenario)["kv"]
            if "refuses to start" in kv.formula:
                out.append(
                    "vLLM: gpu_memory_utilization leaves no memory for the KV cache; it would not start"
                )
        out += self._vision_caveats()
        return tuple(out)

    def _vision_caveats(self) -> list[str]:
        """A multimodal model's parts no trace has checked (docs/fidelity.md, "Multimodal")."""
        v = self.arch.extra.get("vision")
        if not v:
            return []
        s, out = self.scenario, []
        if (
            s.method != "full"
            and any(t in s.lora.targets for t in ("linear_1", "linear_2", "all-linear"))
            and v.get("projector")
        ):
            out.append("LoRA adapters on the projector (linear_1/linear_2) are modelled but not traced")
        if v.get(
            "caveat"
        ):  # Llama 4: one tile per image; transformers 5.24's forward (families/llama4_vlm.py)
            out.append(v["caveat"])
        if v.get(
            "image_note"
        ):  # Qwen2-VL, LLaVA-NeXT: the image size the token count assumes (the family's text)
            out.append(v["image_note"])
        if v["kind"] == "llava":
            out.append(
                f"every image is {v['tower'].extra['image_size']}px ({v['tokens_per_image']} tokens): LLaVA 1.5 pads "
                "or resizes to it; the vision tower's own backward transients are not modelled"
            )
        return out

    def to_dict(self, headroom: float = DEFAULT_HEADROOM) -> dict[str, Any]:
        """The JSON form the CLI prints (``memsim estimate --json``)."""
        by_kind = self.arch.parameters_by_kind()
        return {
            "scenario": self.scenario.to_dict(),
            "model": {
                "family": self.arch.family,
                "parameters": self.parameters,
                "trainable_parameters": self.trainable_parameters,
                "parameters_by_kind": {k: v for k, v in by_kind.items() if v},
                **({"calibration": self.calibration} if self.calibrated else {}),
            },
            "attention": self.attention,
            "peak_tensor_bytes": self.peak_tensor_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_total_bytes": self.device_total_bytes,
            "counters": COUNTERS,
            "uncertainty": self.uncertainty(),
            "caveats": list(self.caveats),
            "peak_phase": self.peak_phase,
            "peak_rank": self.worst.label,
            "step1_peak_allocated_bytes": self.worst.step1_peak_allocated_bytes,
            "components": self.components(),
            "per_rank": [
                {
                    "rank": r.label,
                    "stage": r.stage.index,
                    "role": self.role(r),
                    "layers": r.stage.layers,
                    "peak_phase": r.peak_phase,
                    "peak_tensor_bytes": r.peak_tensor_bytes,
                    "peak_allocated_bytes": r.peak_allocated_bytes,
                    "peak_reserved_bytes": r.peak_reserved_bytes,
                    "device_total_bytes": r.device_total_bytes,
                    "uncertainty": r.uncertainty(),
                    "host_bytes": r.host_bytes,
                    "moments": r.moment_totals(),
                    "components": r.components(),
                }
                for r in self.ranks
            ],
            "breakdown": [{k: v for k, v in row.items() if k != "gib"} for row in self.rows()],
            "gpu": self.gpu.to_dict(),
            "gpu_memory_bytes": self.gpu.memory_bytes,
            "headroom": headroom,
            "fits": self.fits(headroom=headroom),
            "verdict": self.verdict(headroom),
            "recommended_memory_bytes": self.recommended_memory_bytes(headroom),
            "host_bytes": max((r.host_bytes for r in self.ranks), default=0),
            "bottleneck": self.bottleneck(),
            "step_time_s": self.step_time_s,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "mfu": self.mfu,
            "mfu_convention": MFU_CONVENTION,
            "time_breakdown": self.time.categories(),
            "time_caveats": list(self.time_caveats),
            "time_items": self.time_rows(),
            **({"phases": self.phases()} if self.scenario.objective_name != "sft" else {}),
        }

    def summary(self) -> str:
        """One line: peak, moment, counter and verdict."""
        return (
            f"{self.arch.family} peak {fmt_bytes(self.device_total_bytes)} (nvidia-smi) / "
            f"{fmt_bytes(self.peak_allocated_bytes)} allocated at {self.peak_phase} on {self.gpu.name}: "
            f"{self.verdict()}"
        )
