"""The result of a simulation: per-rank peaks, the breakdown at the peak, the verdict, its JSON form and tidy
frames (pandas is imported only when a frame is asked for, so the engine stays pure Python)."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from memsim_widget.architecture import Architecture
from memsim_widget.catalog.gpus import GPU, resolve_gpu
from memsim_widget.engine.activations.calibrated import fit_for
from memsim_widget.engine.caveats import memory_caveats, time_caveats
from memsim_widget.engine.context import Context
from memsim_widget.engine.items import CATEGORIES
from memsim_widget.engine.parallel.rank_roles import rank_role
from memsim_widget.engine.rl.objectives import phase_of, training_scenario
from memsim_widget.engine.rl.rollout import separate_group
from memsim_widget.engine.speed.time_breakdown import StepTime, step_time
from memsim_widget.engine.step.rank_estimate import RankEstimate
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.names import Name
from memsim_widget.scenario import Scenario
from memsim_widget.units import GiB, fmt_bytes

if TYPE_CHECKING:
    import pandas as pd

    from memsim_widget.engine.counters.card_replay import CardReplay

#: Default share of device memory kept free: the run-to-run spread (allocator variance between versions and runs)
#: (docs/memory-facts.md#headroom-and-spread: 454 Megatron runs below 80% never ran out of memory; 10% covers
#: most reports).
DEFAULT_HEADROOM = 0.10


class Verdict(Name):
    """Whether the worst rank fits the GPU: inside ``1 - headroom`` of it, inside the card but within the headroom
    band (the run-to-run spread: the same job's reserved and nvidia-smi figures differ between runs and
    versions), or over the card. Where the reserved counter is replayed (``Scenario.replays_reserved``, the
    default) the allocator's replay on the card's real capacity decides too (``Estimate.card_replay``): a step that runs out of memory there does not fit, and
    ``Estimate.verdict_reason`` names why (it runs, runs only by releasing the cache, fragmentation, total)."""

    FITS = "fits"
    TIGHT = "tight"
    DOES_NOT_FIT = "does not fit"


#: How ``mfu`` counts: model FLOPs per token over the card's dense peak.
MFU_CONVENTION = (
    "model FLOPs per token 6 N + 12 L H Q s (PaLM, arXiv 2204.02311 appendix B: N the matmul parameters a "
    "token passes through, output head included, embedding lookups not; attention without the causal halving; "
    "no recomputation; LoRA/QLoRA: 4 N + 3 x the adapters' forward FLOPs, what they compute) x tokens/s per GPU / dense 16-bit peak (fp32 peak for fp32)"
)

COUNTERS = {
    "peak_tensor_bytes": "live tensor bytes (PyTorch dispatch level, a fake-tensor trace)",
    "peak_allocated_bytes": "torch.cuda.max_memory_allocated()",
    "peak_reserved_bytes": "torch.cuda.max_memory_reserved()",
    "device_total_bytes": "what nvidia-smi shows for the process",
}


@dataclass(frozen=True)
class Estimate:
    """The simulated memory of one training step, per rank, with the peak and its breakdown."""

    scenario: Scenario
    arch: Architecture
    gpu: GPU
    ranks: tuple[RankEstimate, ...]
    trainable_parameters: int

    # ----- headline numbers (per counter, the worst stage) ---------------------------------------
    @cached_property
    def worst(self) -> RankEstimate:
        """The rank the verdict is about: the largest nvidia-smi total (the first of equals)."""
        return self.worst_for("device_total_bytes")

    def worst_for(self, counter: str) -> RankEstimate:
        """The rank with the largest figure of ``counter`` (a key of ``COUNTERS``; the first of equals): with
        pp > 1 the stages differ (the first holds the embedding and the most micro-batches in flight, the last
        the head and loss), and the stage with the largest nvidia-smi total need not allocate the most."""
        return max(self.ranks, key=lambda r: r.counter(counter))

    def peak_ranks(self) -> dict[str, str]:
        """Per headline counter, the label of the rank (pipeline stage) whose figure it is."""
        return {c: self.worst_for(c).label for c in COUNTERS}

    @property
    def peak_tensor_bytes(self) -> int:
        return self.worst_for("peak_tensor_bytes").peak_tensor_bytes

    @property
    def peak_allocated_bytes(self) -> int:
        return self.worst_for("peak_allocated_bytes").peak_allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self.worst_for("peak_reserved_bytes").peak_reserved_bytes

    @property
    def device_total_bytes(self) -> int:
        return self.worst.device_total_bytes

    @property
    def peak_phase(self) -> str:
        """The peak moment of the verdict's rank (``worst``)."""
        return self.worst.peak_phase

    @property
    def attention(self) -> dict[str, str]:
        """The attention kernel the numbers assume: the scenario's, or what transformers runs instead (Gemma 2 has
        no SDPA path and runs eager), with the reason when they differ."""
        requested = self.scenario.attention
        used = self.arch.attention_kernel(requested)
        out = {"requested": requested, "used": used}
        if used != requested:
            out["why"] = "" if self.arch.facts.attention.note is None else self.arch.facts.attention.note
        return out

    @property
    def parameters(self) -> int:
        return self.arch.parameters

    def components(self) -> dict[str, int]:
        return self.worst.components()

    def uncertainty(self) -> dict[str, dict[str, int]]:
        """Low and high bytes of ``peak_allocated_bytes``, ``peak_reserved_bytes`` and ``device_total_bytes``,
        each on the rank whose figure the headline shows (engine/counters/overhead.counter_bands says how each band is
        made)."""
        return {c: band for c in COUNTERS if (band := self.worst_for(c).uncertainty().get(c)) is not None}

    # ----- verdict ------------------------------------------------------------------------------
    def fits(self, gpu: GPU | str | dict | None = None, headroom: float = DEFAULT_HEADROOM) -> bool:
        """True if the worst rank's nvidia-smi total stays under (1 - headroom) of the GPU's memory and, where
        the reserved counter is replayed, its replay on the card runs (``card_replay``; on another ``gpu``: the total
        alone)."""
        card = self.gpu if gpu is None else resolve_gpu(gpu)
        if self.device_total_bytes > card.memory_bytes * (1 - headroom):
            return False
        rep = self.card_replay if card == self.gpu else None
        return rep is None or rep.runs

    def verdict(self, headroom: float = DEFAULT_HEADROOM) -> Verdict:
        """``fits``, ``tight`` (inside the card but within the headroom band: the run-to-run spread) or ``does
        not fit`` (over the card, or, where the reserved counter is replayed, out of memory in the replay on it)."""
        if self.fits(headroom=headroom):
            return Verdict.FITS
        rep = self.card_replay
        if rep is not None and not rep.runs:
            return Verdict.DOES_NOT_FIT
        return Verdict.TIGHT if self.device_total_bytes <= self.gpu.memory_bytes else Verdict.DOES_NOT_FIT

    @cached_property
    def card_replay(self) -> CardReplay | None:
        """Where the reserved counter is replayed (``Scenario.replays_reserved``) on a step the stream models
        (``replayable.replayable``): the
        replay of the verdict's rank on the card's real capacity, its memory less what lives outside the
        allocator (context, NCCL, paged states: ``overhead.reserved_cap``, the split of the
        nvidia-smi figure); None elsewhere (the fitted rule has no stream to replay)."""
        sc = self.scenario
        if not sc.replays_reserved or sc.objective_name != "sft":
            return None
        from memsim_widget.engine.counters.replayable import replayable

        ctx = Context(training_scenario(sc))
        if not replayable(ctx):  # decided without importing the stream and the allocator
            return None
        from memsim_widget.engine.counters.card_replay import card_replay
        from memsim_widget.engine.counters.overhead import reserved_cap

        r = self.worst
        return card_replay(ctx, r.stage, reserved_cap(ctx, sum(i.bytes for i in r.device)))

    @property
    def verdict_reason(self) -> str:
        """Why the replay on the card gives its verdict (``alloc_stream``: ``runs``, ``releases cache``: runs
        only because failed cudaMallocs free the cache, slower; ``fragmentation``; ``total``); '' without it."""
        rep = self.card_replay
        return "" if rep is None else rep.reason

    @property
    def verdict_text(self) -> str:
        """The replay on the card in words ('' without it): the request and the largest free range on OOM."""
        rep = self.card_replay
        return "" if rep is None else rep.text

    def recommended_memory_bytes(self, headroom: float = DEFAULT_HEADROOM) -> int:
        """Smallest device memory that holds the peak with ``headroom`` to spare. Where the reserved counter is
        replayed, when the replay on the card releases the cache or runs out of memory (its reserved counter is
        capped at the card), the card whose room holds the unlimited replay's peak reserved (no cudaMalloc
        fails there) plus what lives outside the allocator."""
        rep = self.card_replay
        total = self.device_total_bytes
        if rep is not None and rep.needed and (rep.cache_releases or not rep.runs):
            total = max(total, total - self.worst.peak_reserved_bytes + rep.needed)
        return int(total / (1 - headroom))

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
        return rank_role(self.scenario, rank.stage, self.arch.num_layers)

    # ----- time ---------------------------------------------------------------------------------
    @cached_property
    def time(self) -> StepTime:
        """The modelled step time and where it goes (computed on first use, so ``estimate`` stays fast)."""
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
        return time_caveats(self.scenario, self.arch, self.gpu)

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
                counted = i.allocated_bytes if i.level.allocated else i.bytes
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
        return self.arch.facts.calibration is not None

    @property
    def calibration(self) -> dict[str, Any] | None:
        """The fit behind a calibrated model's activations (coefficients, held-out residual), else None."""
        if not self.calibrated:
            return None

        fit = fit_for(self.arch, self.scenario)
        return {"source": "calibrated from a trace", **{k: v for k, v in fit.items()}}

    def phases(self) -> dict[str, dict[str, Any]]:
        """Each phase's peak on the worst rank: its moment, allocated bytes and components (training; rollout
        for GRPO/PPO; a separate rollout GPU group's engine as ``rollout_group``)."""
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
        return memory_caveats(self.scenario, self.arch)

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
            "peak_ranks": self.peak_ranks(),
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
            **self._card_dict(),
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

    def verdict_why(self) -> dict[str, str]:
        """``verdict_reason`` and ``verdict_text`` as the JSON outputs carry them (``to_dict``, the widget's result,
        ``memsim recommend --json``); nothing without a replay on the card, so the fitted rule's output is unchanged."""
        rep = self.card_replay
        return {} if rep is None else {"verdict_reason": rep.reason, "verdict_text": rep.text}

    def _card_dict(self) -> dict[str, Any]:
        """``to_dict``'s replay on the card (only where the reserved counter is replayed: the fitted rule's dict
        has none of these keys)."""
        rep = self.card_replay
        if rep is None:
            return {}
        from memsim_widget.engine.counters.allocator import oom_fields  # the replay's module: loaded with it

        f = rep.failure
        return {
            **self.verdict_why(),
            "card_replay": {
                "capacity_bytes": rep.capacity,
                "runs": rep.runs,
                "cache_releases": rep.cache_releases,
                "room_without_release_bytes": rep.needed,
                **oom_fields(f),
                "oom_free_bytes": f.free_bytes if f else None,
                "oom_phase": rep.at or None,
            },
        }

    def summary(self) -> str:
        """One line: peak, moment, counter and verdict."""
        return (
            f"{self.arch.family} peak {fmt_bytes(self.device_total_bytes)} (nvidia-smi) / "
            f"{fmt_bytes(self.peak_allocated_bytes)} allocated at {self.peak_phase} on {self.gpu.name}: "
            f"{self.verdict()}"
        )
