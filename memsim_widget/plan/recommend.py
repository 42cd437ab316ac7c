"""``recommend``: the smallest changes that make a scenario fit, and how far it can be pushed.

Each *lever* is one scenario key a user can turn, with its options and what it costs in words
(the facts the step-time model uses, ``engine/speed/step_time.py``). Combinations are tried by size: every
single lever first, then pairs, then triples; the first size with a fitting combination is returned,
ranked by the modelled slowdown. Every figure comes from ``estimate`` itself.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.engine.speed.time_breakdown import step_time
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.units import GiB

if TYPE_CHECKING:
    import pandas as pd

    from memsim_widget.plan.reach import Reach
    from memsim_widget.plan.space import SearchSpace

#: Largest number of levers combined in one recommendation.
MAX_LEVERS = 3
#: Upper bounds of the "how far" searches.
MAX_MICRO_BATCH = 4096
MAX_SEQ_LEN = 1 << 20
MAX_DP = 4096
#: The planner's pick joins the fixes that keep the job when it is modelled this much faster than all of them
#: (a pick that changes many knobs for a 1% gain is no answer worth reading).
PLANNER_GAIN = 0.98
#: The most GPUs the other layouts (tp, pp with ZeRO-3) are tried on for ``min_gpus``, and the largest power of
#: two searched for ``min_gpus_searched``.
MAX_LAYOUT_GPUS = 1024


@dataclass(frozen=True)
class Option:
    """One setting of a lever: the scenario keys it changes, a label and its cost in words."""

    lever: str
    label: str
    changes: Mapping[str, Any]
    cost: str
    #: Changes what is trained (LoRA/QLoRA instead of full training): listed after every other fix.
    changes_the_job: bool = False


@dataclass
class Change:
    """A set of options applied together, with the estimate before and after."""

    options: tuple[Option, ...]
    scenario: Scenario
    before: Estimate
    after: Estimate
    headroom: float
    #: Modelled step time per token of the original (engine/speed/step_time.py): ``slowdown`` divides by it.
    base_time: float = field(default=1.0, repr=False)

    @cached_property
    def slowdown(self) -> float:
        """Modelled step time per token relative to the original (engine/speed/step_time.py), computed on first use."""
        return _step_time(self.scenario) / self.base_time

    @property
    def changes_the_job(self) -> bool:
        return any(o.changes_the_job for o in self.options)

    @property
    def label(self) -> str:
        return " + ".join(o.label for o in self.options)

    @property
    def cost(self) -> str:
        return "; ".join(o.cost for o in self.options)

    @property
    def changes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for o in self.options:
            out.update(o.changes)
        return out

    @property
    def saved_bytes(self) -> int:
        return self.before.device_total_bytes - self.after.device_total_bytes

    @property
    def fits(self) -> bool:
        return self.after.fits(headroom=self.headroom)

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.label,
            "changes": self.changes,
            "cost": self.cost,
            "changes_the_job": any(o.changes_the_job for o in self.options),
            "saved_bytes": self.saved_bytes,
            "device_total_bytes_before": self.before.device_total_bytes,
            "device_total_bytes_after": self.after.device_total_bytes,
            "fits": self.fits,
            "verdict": self.after.verdict(self.headroom),
            **self.after.verdict_why(),
            "slowdown": round(self.slowdown, 4),
            "components_before": self.before.components(),
            "components_after": self.after.components(),
            "scenario": self.scenario.to_dict(),
        }


def _set(scenario: Scenario, changes: Mapping[str, Any]) -> Scenario:
    """``scenario`` with dotted keys (``parallel.zero``) changed."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        if "." in key:
            head, tail = key.split(".", 1)
            nested.setdefault(head, {})[tail] = value
        else:
            top[key] = value
    return scenario.replace(**top, **nested)


def _checkpointing(s: Scenario) -> list[Option]:
    """Selective, full every 2nd layer, then full activation checkpointing (those not already on)."""
    ck = []
    every = s.checkpoint_every or 1
    if s.activation_checkpointing == "none":
        ck.append(
            Option(
                "checkpointing",
                "selective activation checkpointing",
                {"activation_checkpointing": "selective", "checkpoint_every": None},
                "a few % more compute (attention recomputed in backward)",
            )
        )
    if s.activation_checkpointing != "full" and s.parallel.pp == 1 and not s.activation_offloading:
        ck.append(
            Option(
                "checkpointing",
                "full activation checkpointing of every 2nd layer",
                {"activation_checkpointing": "full", "checkpoint_every": 2},
                "about 17% more compute (half the layers run their forward again in backward)",
            )
        )
    if s.activation_checkpointing != "full" or every > 1:
        ck.append(
            Option(
                "checkpointing",
                "full activation checkpointing",
                {"activation_checkpointing": "full", "checkpoint_every": None},
                "about 33% more compute (the forward pass runs again in backward)",
            )
        )
    return ck


def _chunked_loss(s: Scenario) -> list[Option]:
    """The chunked cross-entropy, unless already chunked."""
    if s.loss == "chunked":
        return []
    return [
        Option(
            "loss",
            "chunked cross-entropy loss",
            {"loss": "chunked"},
            "about 1-2% more compute (the head recomputed per chunk); needs a fused/chunked loss",
        )
    ]


def _optimizer(s: Scenario) -> list[Option]:
    """8-bit AdamW, then paged 8-bit AdamW, in place of Adam/AdamW (or paged in place of 8-bit)."""
    eight = Option(
        "optimizer",
        "8-bit AdamW (bitsandbytes)",
        {"optimizer": "adamw-8bit", "optimizer_impl": "fused"},
        "optimizer states in 8 bits: usually the same quality, a new dependency",
    )
    paged = Option(
        "optimizer",
        "paged 8-bit AdamW (bitsandbytes)",
        {"optimizer": "paged-adamw-8bit", "optimizer_impl": "fused"},
        "8-bit states in unified memory, paged to the host under pressure: slower when it pages",
    )
    if s.optimizer in ("adamw", "adam"):
        return [eight, paged]
    if s.optimizer == "adamw-8bit":
        return [paged]
    return []


def _zero(s: Scenario) -> list[Option]:
    """Each ZeRO stage above the current one, when there are data-parallel (or context) ranks to shard over (the
    shard group under hybrid sharding: ``ParallelConfig.shard_degree``)."""
    par = s.parallel
    shard = par.shard_degree
    if shard <= 1:
        return []
    words = {
        1: "no extra communication (optimizer states sharded)",
        2: "no extra communication (gradients reduce-scattered instead of all-reduced)",
        3: "about 50% more data-parallel communication (weights gathered in forward and backward)",
    }
    return [
        Option("zero", f"ZeRO-{z} / FSDP sharding over {shard} ranks", {"parallel.zero": z}, words[z])
        for z in (1, 2, 3)
        if z > par.zero
    ]


def _offload(s: Scenario) -> list[Option]:
    """Optimizer offload to the CPU (with ZeRO-1 when unsharded), then parameters too (ZeRO-3: DeepSpeed
    ZeRO-Infinity's offload_param), beyond what is offloaded already."""
    par = s.parallel
    out = []
    if par.offload == "none":
        change: dict[str, Any] = {"parallel.offload": "optimizer"}
        if par.zero == 0:
            change["parallel.zero"] = 1
        out.append(
            Option(
                "offload",
                "optimizer offload to CPU" + (" (with ZeRO-1)" if par.zero == 0 else ""),
                change,
                "optimizer step on the CPU and PCIe traffic every step: costly unless steps are long (large "
                "batches)",
            )
        )
    if par.offload != "optimizer+params" and par.pp == 1:
        out.append(
            Option(
                "offload",
                "parameter and optimizer offload to CPU (ZeRO-3)",
                {"parallel.offload": "optimizer+params", "parallel.zero": 3},
                "weights fetched over PCIe for every forward and backward: several times slower on one card",
            )
        )
    return out


def _sequence_parallel(s: Scenario) -> list[Option]:
    """Sequence parallelism, under tensor parallelism without it."""
    if not (s.parallel.tp > 1 and not s.parallel.sequence_parallel):
        return []
    return [
        Option(
            "sequence_parallel",
            "sequence parallelism",
            {"parallel.sequence_parallel": True},
            "no extra communication volume (reduce-scatter + all-gather replace all-reduce)",
        )
    ]


def _activation_offloading(s: Scenario) -> list[Option]:
    """Activation offloading to the CPU, unless on; every layer where only some are offloaded."""
    if s.activation_offloading and s.activation_offloading_layers is not None:
        return [
            Option(
                "activation_offloading",
                "activation offloading of every layer",
                {"activation_offloading_layers": None},
                "more saved activations copied to host and back: slower where the copies no longer overlap",
            )
        ]
    if s.activation_offloading:
        return []
    return [
        Option(
            "activation_offloading",
            "activation offloading to CPU",
            {"activation_offloading": True},
            "saved activations copied to host and back: 5-15% slower when overlap is imperfect",
        )
    ]


def _micro_batch(s: Scenario) -> list[Option]:
    """Half the micro-batch, and 1, with the accumulation that keeps the global batch."""
    if s.micro_batch_size <= 1:
        return []
    b = s.micro_batch_size
    mb = []
    for nb in sorted({b // 2, 1}, reverse=True):
        if nb >= 1 and b % nb == 0 and nb < b:
            mb.append(
                Option(
                    "micro_batch",
                    f"micro-batch {nb} with {b // nb}x gradient accumulation",
                    {"micro_batch_size": nb, "grad_accum_steps": s.grad_accum_steps * (b // nb)},
                    "same global batch; smaller matmuls use the GPU less well",
                )
            )
    return mb


def _layout(s: Scenario) -> list[Option]:
    """Twice the tensor parallelism out of the data parallelism, within a node of 8."""
    par = s.parallel
    if not (par.dp % 2 == 0 and par.tp * 2 <= 8):
        return []
    change: dict[str, Any] = {"parallel.tp": par.tp * 2, "parallel.dp": par.dp // 2}
    if par.dp_shard is not None:  # hybrid sharding: the shard group kept where it still tiles dp
        change["parallel.dp_shard"] = math.gcd(par.dp_shard, par.dp // 2)
    return [
        Option(
            "layout",
            f"tensor parallel tp={par.tp * 2} (dp={par.dp // 2})",
            change,
            "weights and activations split over twice the GPUs; tensor-parallel all-reduces every layer",
        )
    ]


def _method(s: Scenario) -> list[Option]:
    """LoRA or QLoRA in place of full training (they change the job), QLoRA in place of LoRA."""
    if s.method == "full":
        return [
            Option(
                "method",
                "LoRA instead of full fine-tuning",
                {"method": "lora"},
                "trains low-rank adapters only: a different fine-tune, far less state",
                changes_the_job=True,
            ),
            Option(
                "method",
                "QLoRA (4-bit base weights) instead of full fine-tuning",
                {"method": "qlora"},
                "trains adapters on a 4-bit base: a different fine-tune, slower matmuls (dequantisation)",
                changes_the_job=True,
            ),
        ]
    if s.method == "lora":
        return [
            Option(
                "method",
                "QLoRA: 4-bit base weights",
                {"method": "qlora"},
                "base weights in NF4: slower matmuls (dequantisation), slightly different results",
            )
        ]
    return []


def _sequence(s: Scenario) -> list[Option]:
    """Half the sequence length (a different job: shorter samples, or more of them packed differently)."""
    step = 128 * max(s.parallel.cp, 1)
    half = s.seq_len // 2 // step * step
    if half < step or s.objective_name != "sft":
        return []
    return [
        Option(
            "sequence",
            f"sequences of {half} tokens (was {s.seq_len})",
            {"seq_len": half},
            "shorter samples: long documents truncated or split (the model sees less context)",
            changes_the_job=True,
        )
    ]


#: The levers of every job, each with the function giving its options, in the order ``levers`` lists them.
_LEVERS: tuple[tuple[str, Callable[[Scenario], list[Option]]], ...] = (
    ("checkpointing", _checkpointing),
    ("loss", _chunked_loss),
    ("optimizer", _optimizer),
    ("zero", _zero),
    ("offload", _offload),
    ("sequence_parallel", _sequence_parallel),
    ("activation_offloading", _activation_offloading),
    ("micro_batch", _micro_batch),
    ("layout", _layout),
)
#: Levers that change what is trained (offered after every fix that keeps the job), in order.
_JOB_LEVERS: tuple[tuple[str, Callable[[Scenario], list[Option]]], ...] = (
    ("method", _method),
    ("sequence", _sequence),
)


def levers(scenario: Scenario, job: bool = True) -> dict[str, list[Option]]:
    """The options of each lever that differ from ``scenario`` and apply to it (``job``: with the levers that
    change the job: method and sequence length, and the RL levers that change the samples)."""
    out = {name: options(scenario) for name, options in _LEVERS}
    if job:
        out.update({name: options(scenario) for name, options in _JOB_LEVERS})
    if scenario.objective_name != "sft":
        out.update(rl_levers(scenario))
        if not job:
            out.pop("generations", None)
    return {k: v for k, v in out.items() if v}


def _generations(s: Scenario) -> list[Option]:
    """GRPO: half the completions per prompt (a different job)."""
    rl = s.rl_config
    if not (s.objective_name == "grpo" and rl.num_generations > 2):
        return []
    g = rl.num_generations // 2
    return [
        Option(
            "generations",
            f"G = {g} completions per prompt (was {rl.num_generations})",
            {"rl.num_generations": g},
            "fewer samples per group: noisier group-relative advantages (or more steps for the same samples)",
            changes_the_job=True,
        )
    ]


def _completions(s: Scenario) -> list[Option]:
    """GRPO: half the completions per micro-batch (or 1), the accumulation keeping the step's completions."""
    n = s.sequences_per_micro_batch
    if not (s.objective_name == "grpo" and n > 1):
        return []
    half = n // 2 if n % 2 == 0 else 1
    return [
        Option(
            "completions",
            f"{half} completions per micro-batch (was {n}) with {n // half}x gradient accumulation",
            {
                "rl.completions_per_micro_batch": half,
                "grad_accum_steps": s.grad_accum_steps * (n // half),
            },
            "same completions per step, a prompt's group split over micro-batches (TRL "
            "per_device_train_batch_size); smaller matmuls use the GPU less well",
        )
    ]


def _reference(s: Scenario) -> list[Option]:
    """Where the reference lives: the LoRA policy's own base, precomputed log-probs, or offloaded."""
    obj, ref = s.objective_name, s.reference
    refs = []
    if ref in ("gpu", "offload") and s.method != "full":
        refs.append(
            Option(
                "reference",
                "reference = the LoRA policy's own base (adapters disabled)",
                {"rl.reference": "shared_base"},
                "no second copy of the weights; the reference forward runs on the policy's base (TRL's PEFT default)",
            )
        )
    if ref in ("gpu", "offload", "shared_base") and obj in ("dpo", "kto"):
        refs.append(
            Option(
                "reference",
                "reference log-probs precomputed",
                {"rl.reference": "precomputed"},
                "one pass over the dataset before training (TRL precompute_ref_log_probs); no reference in the step",
            )
        )
    if ref == "gpu":
        refs.append(
            Option(
                "reference",
                "reference model offloaded to CPU",
                {"rl.reference": "offload"},
                "its weights cross PCIe for every forward (OpenRLHF --ref_reward_offload)",
            )
        )
    return refs


def _colocated(s: Scenario) -> bool:
    """A GRPO or PPO job whose vLLM engine shares the training GPUs."""
    return s.objective_name in ("grpo", "ppo") and s.rl_config.rollout == "vllm_colocate"


def _gpu_memory_utilization(s: Scenario) -> list[Option]:
    """A colocated engine sized by utilization: half its budget."""
    rl = s.rl_config
    if not (_colocated(s) and rl.kv_cache == "utilization" and rl.gpu_memory_utilization > 0.1):
        return []
    u = round(rl.gpu_memory_utilization / 2, 2)
    return [
        Option(
            "gpu_memory_utilization",
            f"vLLM gpu_memory_utilization {u:g} (was {rl.gpu_memory_utilization:g})",
            {"rl.gpu_memory_utilization": u},
            "a smaller KV cache: fewer sequences generated at once (slower rollouts)",
        )
    ]


def _sleep_mode(s: Scenario) -> list[Option]:
    """A colocated engine without sleep mode: level 1."""
    if not (_colocated(s) and s.rl_config.sleep_mode == 0):
        return []
    return [
        Option(
            "sleep_mode",
            "vLLM sleep mode (level 1)",
            {"rl.sleep_mode": 1},
            "weights to host RAM and KV cache freed while training; a wake-up per step (seconds)",
        )
    ]


def _rollout(s: Scenario) -> list[Option]:
    """A colocated engine moved to its own GPUs."""
    if not _colocated(s):
        return []
    return [
        Option(
            "rollout",
            "a separate rollout GPU group (vLLM server)",
            {"rl.rollout": "vllm_separate"},
            "more GPUs: generation runs on its own cards (TRL vllm_mode='server')",
        )
    ]


#: The levers of preference and RL jobs, in the order ``rl_levers`` lists them.
_RL_LEVERS: tuple[tuple[str, Callable[[Scenario], list[Option]]], ...] = (
    ("generations", _generations),
    ("completions", _completions),
    ("reference", _reference),
    ("gpu_memory_utilization", _gpu_memory_utilization),
    ("sleep_mode", _sleep_mode),
    ("rollout", _rollout),
)


def rl_levers(s: Scenario) -> dict[str, list[Option]]:
    """The levers of preference and RL jobs: fewer completions per prompt, where the reference lives, the
    colocated vLLM engine's budget and sleep mode, a separate rollout GPU group (``engine/rl/objectives.py``,
    ``engine/rl/rollout.py``)."""
    out = {name: options(s) for name, options in _RL_LEVERS}
    return {k: v for k, v in out.items() if v}


def _step_time(scenario: Scenario) -> float:
    """Modelled step time per token (``engine/speed/step_time.py``, as ``estimate``) of one scenario."""
    from memsim_widget.engine.rl.objectives import training_scenario

    return 1.0 / step_time(Context(training_scenario(scenario))).tokens_per_second_per_gpu


def _combos(groups: dict[str, list[Option]], size: int) -> Iterator[tuple[Option, ...]]:
    for names in itertools.combinations(sorted(groups), size):
        yield from itertools.product(*(groups[n] for n in names))


@dataclass
class Recommendation:
    """What makes ``scenario`` fit, and how far it can be pushed on its GPU."""

    scenario: Scenario
    estimate: Estimate
    headroom: float
    changes: list[Change] = field(default_factory=list)
    singles: list[Change] = field(default_factory=list)
    max_micro_batch: int | None = None
    max_seq_len: int | None = None
    min_gpus: dict[str, Any] | None = None
    #: Why no GPU count fits (what does not shard over data parallelism), when ``min_gpus`` is None.
    min_gpus_reason: str | None = None
    #: With the first recommended change applied: its label and the largest micro-batch that then fits.
    with_first_fix: dict[str, Any] | None = None
    #: When no change fits: which resource bounds the scenario, in words.
    bound: str | None = None
    #: The catalog card with the least memory (more than this one's) that holds the scenario as it is.
    smallest_card: dict[str, Any] | None = None
    #: The largest micro-batch / sequence on the same GPUs with any layout and knobs of the planner's space
    #: (global batch free), and the cheapest candidate that reaches it (``plan.reach``); None when none fits
    #: or the planner does not model the scenario.
    max_micro_batch_searched: Reach | None = None
    max_seq_len_searched: Reach | None = None
    #: The fewest GPUs (powers of two up to ``MAX_LAYOUT_GPUS``) with any layout and knobs of the planner's
    #: space (the job and card kept, global batch free), and the candidate ``plan`` ranks first there
    #: (``plan.reach.fewest_gpus``); None when none fits or the planner does not model the scenario.
    min_gpus_searched: Reach | None = None

    @property
    def fits(self) -> bool:
        return self.estimate.fits(headroom=self.headroom)

    @property
    def frame(self) -> pd.DataFrame:
        """One row per recommended change (or, when the scenario fits, per single lever)."""
        import pandas as pd

        rows = [
            {
                "change": c.label,
                "changes_the_job": c.changes_the_job,
                "fits": c.fits,
                "saved_gib": c.saved_bytes / GiB,
                "device_total_gib": c.after.device_total_bytes / GiB,
                "slowdown": c.slowdown,
                "cost": c.cost,
            }
            for c in (self.changes or self.singles)
        ]
        return pd.DataFrame(
            rows,
            columns=[
                "change",
                "changes_the_job",
                "fits",
                "saved_gib",
                "device_total_gib",
                "slowdown",
                "cost",
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``memsim recommend --json``)."""
        return {
            "scenario": self.scenario.to_dict(),
            "device_total_bytes": self.estimate.device_total_bytes,
            "gpu_memory_bytes": self.estimate.gpu.memory_bytes,
            "headroom": self.headroom,
            "fits": self.fits,
            "verdict": self.estimate.verdict(self.headroom),
            **self.estimate.verdict_why(),
            "recommendations": [c.to_dict() for c in self.changes],
            "levers": [c.to_dict() for c in self.singles],
            "max_micro_batch": self.max_micro_batch,
            "max_seq_len": self.max_seq_len,
            "min_gpus": self.min_gpus,
            "min_gpus_reason": self.min_gpus_reason,
            "with_first_fix": self.with_first_fix,
            "bound": self.bound,
            "smallest_card": self.smallest_card,
            "max_micro_batch_searched": _reach_dict(self.max_micro_batch_searched),
            "max_seq_len_searched": _reach_dict(self.max_seq_len_searched),
            "min_gpus_searched": _reach_dict(self.min_gpus_searched),
        }

    def summary(self) -> str:
        head = f"{self.estimate.summary()}"
        if self.fits:
            return head + f"; max micro-batch {self.max_micro_batch}, max sequence {self.max_seq_len}"
        if not self.changes:
            return head + f"; no lever fits: {self.bound}"
        best = self.changes[0]
        return head + f"; smallest fix: {best.label} (saves {best.saved_bytes / GiB:.1f} GiB; {best.cost})"


def _reach_dict(r: Reach | None) -> dict[str, Any] | None:
    return None if r is None else r.to_dict()


def _reach(scenario: Scenario, key: str, headroom: float) -> Reach | None:
    """``plan.reach`` of ``key`` on the scenario's GPUs over ``planner_space`` (micro-batch up to
    ``MAX_MICRO_BATCH``; sequence in steps of 128 tokens up to ``MAX_SEQ_LEN`` or the position table; for
    ``num_gpus`` the fewest GPUs, powers of two up to ``MAX_LAYOUT_GPUS``), or None where the planner does not
    model the scenario."""
    from memsim_widget.plan.reach import fewest_gpus, reach

    try:
        if key == "num_gpus":
            return fewest_gpus(scenario, planner_space(scenario), top=MAX_LAYOUT_GPUS, headroom=headroom)
        if key == "seq_len":
            table = Context(scenario).arch.max_seq_len
            step, top = 128, min(MAX_SEQ_LEN, table) if table else MAX_SEQ_LEN
        else:
            step, top = 1, MAX_MICRO_BATCH
        return reach(scenario, key, planner_space(scenario), step=step, top=top, headroom=headroom)
    except ScenarioError:
        return None


def largest_passing(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The largest n in [lo, hi] with fits(n), assuming memory grows with n (doubling, then bisection)."""
    if not fits(lo):
        return None
    good, n = lo, lo
    while n < hi:
        n = min(n * 2, hi)
        if not fits(n):
            bad = n
            break
        good = n
    else:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def _smallest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest n in [lo, hi] with fits(n), assuming memory shrinks as n grows: one past the largest
    that does not fit (the same doubling, then bisection)."""
    failing = largest_passing(lambda n: not fits(n), lo, hi)
    if failing is None:
        return lo
    return failing + 1 if failing < hi else None


def _fits(scenario: Scenario, headroom: float) -> bool:
    try:
        return estimate(scenario).fits(headroom=headroom)
    except ScenarioError:
        return False


def _merged(opts: tuple[Option, ...]) -> dict[str, Any]:
    """The scenario keys of options applied together; ZeRO takes the highest stage any of them needs (an
    offload's carrier stage rides on a chosen ZeRO stage)."""
    merged: dict[str, Any] = {}
    for o in opts:
        for key, value in o.changes.items():
            if key == "parallel.zero" and key in merged:
                value = max(value, merged[key])
            merged[key] = value
    return merged


@dataclass
class _Search:
    """The combinations of one scenario's levers, each estimated once (by the scenario keys it sets)."""

    scenario: Scenario
    before: Estimate
    headroom: float
    base_time: float
    seen: dict[str, Change | None] = field(default_factory=dict)

    def change(self, opts: tuple[Option, ...]) -> Change | None:
        """``opts`` applied together, estimated (None: the engine refuses the combination)."""
        merged = _merged(opts)
        key = repr(sorted(merged.items()))
        if key in self.seen:
            found = self.seen[key]
            # the same scenario reached with more levers is no new answer
            return None if found is None or len(found.options) < len(opts) else found
        try:
            sc = _set(self.scenario, merged)
            after = estimate(sc)
        except ScenarioError:
            self.seen[key] = None
            return None
        c = Change(opts, sc, self.before, after, self.headroom, self.base_time)
        self.seen[key] = c
        return c

    def smallest(self, groups: dict[str, list[Option]], fixed: tuple[Option, ...] = (), most: int = MAX_LEVERS
                 ) -> list[Change]:  # fmt: skip
        """The fitting combinations of the fewest levers of ``groups`` (with ``fixed`` applied too)."""
        for size in range(0 if fixed else 1, min(most, len(groups)) + 1):
            found = [
                c for opts in _combos(groups, size) if (c := self.change(fixed + opts)) is not None and c.fits
            ]
            if found:
                return sorted(found, key=_order)
        return []

    def greedy(self, groups: dict[str, list[Option]], fixed: tuple[Option, ...] = ()) -> Change | None:
        """Past ``MAX_LEVERS``: add the option that saves most until it fits, then drop every lever it still
        fits without (the slowest first): a fitting set none of whose levers is superfluous, or None."""
        chosen: dict[str, Option] = {}
        current = self.change(fixed) if fixed else None
        mem = current.after.device_total_bytes if current else self.before.device_total_bytes
        while not (current is not None and current.fits):
            best: tuple[int, str, Option, Change] | None = None
            for name, options in groups.items():
                if name in chosen:
                    continue
                for o in options:
                    c = self.change(fixed + tuple(chosen.values()) + (o,))
                    if c is not None and c.after.device_total_bytes < (best[0] if best else mem):
                        best = (c.after.device_total_bytes, name, o, c)
            if best is None:
                return None
            mem, name, o, current = best
            chosen[name] = o

        def cost(name: str) -> float:
            c = self.change(fixed + (chosen[name],))
            return c.slowdown if c is not None else 0.0

        for name in sorted(chosen, key=cost, reverse=True):
            rest = {k: v for k, v in chosen.items() if k != name}
            c = self.change(fixed + tuple(rest.values())) if rest or fixed else None
            if c is not None and c.fits:
                chosen, current = rest, c
        return current


def _order(c: Change) -> tuple:
    """Changes that keep the job first, then fewer levers, then the least modelled slowdown."""
    return (c.changes_the_job, len(c.options), c.slowdown, -c.saved_bytes)


def _fixes(search: _Search, keep: dict[str, list[Option]], job: dict[str, list[Option]]) -> list[Change]:
    """The smallest fixes that keep the job (up to ``MAX_LEVERS`` levers, else a greedy set; then the
    planner's best candidate on the same GPUs when it is faster than all of them), then for each option that
    changes the job the fewest levers that make it fit with it."""
    same = search.smallest(keep)
    if not same and (g := search.greedy(keep)) is not None:
        same = [g]
    best = _planner_option(search.scenario, search.headroom)
    c = search.change((best,)) if best is not None else None
    if c is not None and c.fits and (not same or c.slowdown < PLANNER_GAIN * min(x.slowdown for x in same)):
        same = sorted([*same[:9], c], key=_order)
    other: list[Change] = []
    for opts in _combos(job, 1):
        found = search.smallest(keep, opts, most=1) or [
            g for g in [search.greedy(keep, opts)] if g is not None
        ]
        other += found[:2]
    # One order over both lists: LoRA -> QLoRA is among the job changes searched but keeps the job.
    return sorted(same[:10] + sorted(other, key=_order)[:6], key=_order)


def planner_space(scenario: Scenario) -> SearchSpace:
    """The planner's space for recommend's searches: every knob, the scenario's optimizer and 8-bit AdamW
    in place of Adam/AdamW, and every offload (parameter offload included)."""
    from memsim_widget.plan.space import SearchSpace

    opts = (
        (scenario.optimizer, "adamw-8bit")
        if scenario.optimizer in ("adam", "adamw")
        else (scenario.optimizer,)
    )
    return SearchSpace(optimizers=opts, offload=("none", "optimizer", "optimizer+params"))


def _planner_option(scenario: Scenario, headroom: float) -> Option | None:
    """The planner's best candidate (``plan.search.plan``, ranked by modelled tokens/s per GPU) on the
    scenario's own GPUs, with its global batch and method kept, as one option; None when nothing fits there
    or the planner does not model the scenario (an RL objective, a calibrated model)."""
    from memsim_widget.plan.reach import layout_words
    from memsim_widget.plan.search import plan

    if scenario.objective_name != "sft":
        return None
    par = scenario.parallel
    per_replica = (
        scenario.micro_batch_size * scenario.grad_accum_steps * (par.pp_microbatches if par.pp > 1 else 1)
    )
    try:
        p = plan(
            base=scenario,
            gpus=par.world_size,
            space=planner_space(scenario),
            headroom=headroom,
            top=1,
            widen=False,
            global_batch_tokens=par.dp * par.cp * per_replica * Context(scenario).seq_len // par.cp,
        )
    except ScenarioError:
        return None
    best = p.best()
    if best is None:
        return None
    old, new = scenario.to_dict(), best.to_dict()
    changes = {k: new[k] for k in new if k not in ("parallel", "num_gpus") and new[k] != old[k]}
    changes.update({f"parallel.{k}": v for k, v in new["parallel"].items() if v != old["parallel"][k]})
    label = f"the planner's best layout on {best.parallel.world_size} GPUs: {layout_words(best)}"
    cost = (
        "several knobs at once: memsim plan's fastest fitting candidate for these GPUs and this global batch"
    )
    return Option("planner", label, changes, cost)


def recommend(scenario: Scenario | Mapping[str, Any], headroom: float = DEFAULT_HEADROOM) -> Recommendation:
    """The smallest sets of changes that make ``scenario`` fit its GPU with ``headroom`` (fewest levers
    first, then the least modelled slowdown, changes of the job itself last), the largest micro-batch
    and sequence that fit as it is, the fewest GPUs (with the scenario's knobs and with any layout and knobs of
    the planner's space, each with the cheapest layout that fits on them) and the smallest catalog card that
    holds it; when nothing fits, what bounds it."""
    if not isinstance(scenario, Scenario):
        scenario = Scenario.from_dict(scenario)
    if not 0 <= headroom < 1:
        raise ScenarioError("headroom", f"must be in [0, 1), got {headroom!r}")
    before = estimate(scenario)
    search = _Search(scenario, before, headroom, _step_time(scenario))
    rec = Recommendation(scenario, before, headroom)
    keep, job = levers(scenario, job=False), levers(scenario)
    job = {k: v for k, v in job.items() if k not in keep}
    singles = [c for opts in _combos({**keep, **job}, 1) if (c := search.change(opts)) is not None]
    rec.singles = sorted((c for c in singles if c.saved_bytes > 0), key=lambda c: -c.saved_bytes)

    if not rec.fits:
        rec.changes = _fixes(search, keep, job)
        if rec.changes:
            fixed = rec.changes[0].scenario
            rec.with_first_fix = {
                "change": rec.changes[0].label,
                "max_micro_batch": largest_passing(
                    lambda b: _fits(fixed.replace(micro_batch_size=b), headroom), 1, MAX_MICRO_BATCH
                ),
            }
        if not any(not c.changes_the_job for c in rec.changes):  # no fix keeps the job: say what bounds it
            rec.bound = _bound(search, keep if rec.changes else {**keep, **job})

    ctx = Context(scenario)
    rec.max_micro_batch = largest_passing(
        lambda b: _fits(scenario.replace(micro_batch_size=b), headroom), 1, MAX_MICRO_BATCH
    )
    rec.max_micro_batch_searched = _reach(scenario, "micro_batch_size", headroom)
    if ctx.arch.fixed_seq_len is None:
        rec.max_seq_len = _max_seq_len(scenario, ctx.arch.max_seq_len, headroom)
        rec.max_seq_len_searched = _reach(scenario, "seq_len", headroom)
    rec.min_gpus = _min_gpus(scenario, headroom)
    rec.min_gpus_searched = _reach(scenario, "num_gpus", headroom)
    if rec.min_gpus is None:
        rec.min_gpus_reason = _why_no_gpu_count(scenario, headroom)
    rec.smallest_card = _smallest_card(scenario, headroom)
    return rec


def _bound(search: _Search, groups: dict[str, list[Option]]) -> str:
    """What bounds a scenario no lever set fits: every lever at its strongest, and the largest part left."""
    strongest = tuple(v[-1] for v in groups.values())
    c = None
    while strongest and (c := search.change(strongest)) is None:
        strongest = strongest[:-1]  # drop levers the engine refuses together, the last first
    est = c.after if c is not None else search.before
    comps = est.components()
    biggest = max(comps, key=comps.get)  # type: ignore[arg-type]
    usable = est.gpu.memory_bytes * (1 - search.headroom)
    what = "the card" if est.device_total_bytes > usable else "the headroom"
    if biggest == "activations" and comps[biggest] > usable:
        what = "the card: the activations of one micro-batch alone exceed it"
    return (
        f"even with {' + '.join(o.label for o in strongest) or 'no lever'} each GPU needs "
        f"{est.device_total_bytes / GiB:.1f} GiB of {usable / GiB:.1f} GiB usable; bounded by {what} (largest part "
        f"left: {biggest}, {comps[biggest] / GiB:.1f} GiB); more GPUs or a larger card (below)"
    )


def _max_seq_len(scenario: Scenario, table: int | None, headroom: float) -> int | None:
    """The longest sequence that fits: multiples of 128 x cp up to what the model's position table allows
    (``table``, learned positions; None: no bound but MAX_SEQ_LEN), else that bound itself when it fits."""
    step = max(scenario.parallel.cp, 1) * 128
    top = min(MAX_SEQ_LEN, table) if table else MAX_SEQ_LEN
    # GRPO/PPO: the sequence is prompt + a fixed completion, so it starts above the completion
    lo = scenario.rl_config.completion_len // step + 1 if scenario.objective_name in ("grpo", "ppo") else 1
    if lo > top // step:
        return None
    best = largest_passing(lambda k: _fits(scenario.replace(seq_len=k * step), headroom), lo, top // step)
    longest = best * step if best else None
    # a bound between two steps (a 200-row table): the bound itself when everything below it fits
    at_bound = bool(top % step) and top % scenario.parallel.cp == 0 and longest in (None, top // step * step)
    return top if at_bound and _fits(scenario.replace(seq_len=top), headroom) else longest


def _why_no_gpu_count(scenario: Scenario, headroom: float) -> str:
    """Why more data-parallel GPUs cannot make ``scenario`` fit: what stays on every GPU however wide."""
    wide = estimate(
        scenario.replace(parallel={"dp": MAX_DP, "dp_shard": None, "zero": 3, "offload": "none", "ep": 1})
    )
    comps = wide.components()
    biggest = max(comps, key=comps.get)  # type: ignore[arg-type]
    return (
        f"even sharded over {MAX_DP} data-parallel ranks with ZeRO-3 each GPU needs "
        f"{wide.device_total_bytes / GiB:.1f} GiB ({biggest}: {comps[biggest] / GiB:.1f} GiB, which does not "
        f"shard over data parallelism); change a lever first (see the recommendations)"
    )


def _min_gpus(scenario: Scenario, headroom: float) -> dict[str, Any] | None:
    """The fewest GPUs that fit, with the cheapest layout that fits on them: data parallelism grown with
    the layout kept (ZeRO-3 when it was ZeRO-0, since unsharded replicas never get smaller), and on each
    power of two up to that count the layouts that make more GPUs pay (tp within a node, pp, each with
    ZeRO-3 over the data-parallel ranks); the fewest GPUs win, then the fastest modelled step."""
    par = scenario.parallel
    zero = par.zero if par.zero else 3

    def at(dp: int, tp: int = par.tp, pp: int = par.pp) -> Scenario:
        z = zero if dp * par.cp > 1 else 0
        off = par.offload if z else "none"
        if off == "optimizer+params" and z != 3:
            off = "optimizer"
        ep = par.ep if (dp * par.cp) % par.ep == 0 else 1
        pm = max(pp, par.pp_microbatches) if pp > 1 else par.pp_microbatches
        return scenario.replace(
            parallel={
                "dp": dp,
                # hybrid sharding: the largest shard group within the scenario's that tiles dp (never sharding
                # over more ranks than the user's job does)
                "dp_shard": None if par.dp_shard is None else math.gcd(par.dp_shard, dp),
                "tp": tp,
                "pp": pp,
                "zero": z,
                "offload": off,
                "ep": ep,
                "pp_microbatches": pm,
            }
        )

    other = par.tp * par.pp * par.cp
    d = _smallest(lambda dp: _fits(at(dp), headroom), 1, MAX_DP)
    found = [] if d is None else [at(d)]
    most = d * other if d is not None else MAX_LAYOUT_GPUS

    def fits_on(n: int, tp: int, pp: int) -> Scenario | None:
        if n % (tp * pp * par.cp):
            return None
        try:
            cand = at(n // (tp * pp * par.cp), tp, pp)
            return cand if estimate(cand).fits(headroom=headroom) else None
        except ScenarioError:
            return None

    # other layouts, kept only where they fit on the most GPUs looked at (memory per GPU falls as they grow)
    shapes = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8, 16) if (tp, pp) != (par.tp, par.pp)]
    top = 1 << max(most - 1, 1).bit_length()  # the power of two at or above ``most``
    shapes = [sh for sh in shapes if fits_on(min(top, MAX_LAYOUT_GPUS), *sh) is not None]
    n = 1
    while shapes and n < most:  # powers of two below the kept layout's count
        found += [c for sh in shapes if (c := fits_on(n, *sh)) is not None]
        if any(c.parallel.world_size <= n for c in found):
            break
        n *= 2
    if not found:
        return None
    best = min(found, key=lambda c: (c.parallel.world_size, _step_time(c)))
    bp = best.parallel
    return {
        "num_gpus": bp.world_size,
        "dp": bp.dp,
        "tp": bp.tp,
        "pp": bp.pp,
        "zero": bp.zero,
        "device_total_bytes": estimate(best).device_total_bytes,
        "scenario": best.to_dict(),
    }


def _smallest_card(scenario: Scenario, headroom: float) -> dict[str, Any] | None:
    """The catalog card with the least memory that holds ``scenario`` as it is (same layout), or None."""
    from memsim_widget.catalog.gpus import GPUS

    own = estimate(scenario).gpu.memory_bytes
    for gpu in sorted(GPUS.values(), key=lambda g: (g.memory_bytes, g.id)):
        if gpu.generation == "custom" or gpu.memory_bytes <= own:
            continue
        try:
            est = estimate(scenario.replace(gpu=gpu.id))
        except ScenarioError:
            continue
        if est.fits(headroom=headroom):
            return {"gpu": gpu.id, "name": gpu.name, "memory_gib": round(gpu.memory_gib, 2),
                    "device_total_bytes": est.device_total_bytes}  # fmt: skip
    return None
