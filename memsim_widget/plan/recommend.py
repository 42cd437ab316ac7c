"""``recommend``: the smallest changes that make a scenario fit, and how far it can be pushed.

Each *lever* is one scenario key a user can turn, with its options and what it costs in words
(the facts the step-time model uses, ``engine/step_time.py``). Combinations are tried by size: every
single lever first, then pairs, then triples; the first size with a fitting combination is returned,
ranked by the modelled slowdown. Every figure comes from ``estimate`` itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.time_breakdown import step_time
from memsim_widget.errors import ScenarioError
from memsim_widget.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.scenario import Scenario

if TYPE_CHECKING:
    import pandas as pd

GiB = 1024**3
#: Largest number of levers combined in one recommendation.
MAX_LEVERS = 3
#: Upper bounds of the "how far" searches.
MAX_MICRO_BATCH = 4096
MAX_SEQ_LEN = 1 << 20
MAX_DP = 4096


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
    slowdown: float  # modelled step time per token relative to the original (engine/step_time.py)

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
    """Selective, then full activation checkpointing (those not already on)."""
    ck = []
    if s.activation_checkpointing == "none":
        ck.append(
            Option(
                "checkpointing",
                "selective activation checkpointing",
                {"activation_checkpointing": "selective"},
                "a few % more compute (attention recomputed in backward)",
            )
        )
    if s.activation_checkpointing != "full":
        ck.append(
            Option(
                "checkpointing",
                "full activation checkpointing",
                {"activation_checkpointing": "full"},
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
    """8-bit AdamW in place of Adam/AdamW."""
    if s.optimizer not in ("adamw", "adam"):
        return []
    return [
        Option(
            "optimizer",
            "8-bit AdamW (bitsandbytes)",
            {"optimizer": "adamw-8bit", "optimizer_impl": "fused"},
            "optimizer states in 8 bits: usually the same quality, a new dependency",
        )
    ]


def _zero(s: Scenario) -> list[Option]:
    """Each ZeRO stage above the current one, when there are data-parallel (or context) ranks to shard over."""
    par = s.parallel
    shard = par.dp * par.cp
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
    """Optimizer offload to the CPU (with ZeRO-1 when unsharded), unless something is offloaded already."""
    par = s.parallel
    if par.offload != "none":
        return []
    change: dict[str, Any] = {"parallel.offload": "optimizer"}
    if par.zero == 0:
        change["parallel.zero"] = 1
    return [
        Option(
            "offload",
            "optimizer offload to CPU" + (" (with ZeRO-1)" if par.zero == 0 else ""),
            change,
            "optimizer step on the CPU and PCIe traffic every step: costly unless steps are long (large batches)",
        )
    ]


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
    """Activation offloading to the CPU, unless on."""
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
    return [
        Option(
            "layout",
            f"tensor parallel tp={par.tp * 2} (dp={par.dp // 2})",
            {"parallel.tp": par.tp * 2, "parallel.dp": par.dp // 2},
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
    ("method", _method),
)


def levers(scenario: Scenario) -> dict[str, list[Option]]:
    """The options of each lever that differ from ``scenario`` and apply to it."""
    out = {name: options(scenario) for name, options in _LEVERS}
    if scenario.objective_name != "sft":
        out.update(rl_levers(scenario))
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
    colocated vLLM engine's budget and sleep mode, a separate rollout GPU group (``engine/objectives.py``,
    ``engine/rollout.py``)."""
    out = {name: options(s) for name, options in _RL_LEVERS}
    return {k: v for k, v in out.items() if v}


def _step_time(scenario: Scenario) -> float:
    """Modelled step time per token (``engine/step_time.py``, as ``estimate``) of one scenario."""
    from memsim_widget.engine.objectives import training_scenario

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
                "fits": c.fits,
                "saved_gib": c.saved_bytes / GiB,
                "device_total_gib": c.after.device_total_bytes / GiB,
                "slowdown": c.slowdown,
                "cost": c.cost,
            }
            for c in (self.changes or self.singles)
        ]
        return pd.DataFrame(
            rows, columns=["change", "fits", "saved_gib", "device_total_gib", "slowdown", "cost"]
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
            "recommendations": [c.to_dict() for c in self.changes],
            "levers": [c.to_dict() for c in self.singles],
            "max_micro_batch": self.max_micro_batch,
            "max_seq_len": self.max_seq_len,
            "min_gpus": self.min_gpus,
            "min_gpus_reason": self.min_gpus_reason,
            "with_first_fix": self.with_first_fix,
        }

    def summary(self) -> str:
        head = f"{self.estimate.summary()}"
        if self.fits:
            return head + f"; max micro-batch {self.max_micro_batch}, max sequence {self.max_seq_len}"
        if not self.changes:
            return head + "; no combination of up to three levers fits"
        best = self.changes[0]
        return head + f"; smallest fix: {best.label} (saves {best.saved_bytes / GiB:.1f} GiB; {best.cost})"


def _largest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
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
    failing = _largest(lambda n: not fits(n), lo, hi)
    if failing is None:
        return lo
    return failing + 1 if failing < hi else None


def _fits(scenario: Scenario, headroom: float) -> bool:
    try:
        return estimate(scenario).fits(headroom=headroom)
    except ScenarioError:
        return False


def recommend(scenario: Scenario | Mapping[str, Any], headroom: float = DEFAULT_HEADROOM) -> Recommendation:
    """The smallest sets of changes that make ``scenario`` fit its GPU with ``headroom`` (fewest levers
    first, then the least modelled slowdown, changes of the job itself last), the largest micro-batch
    and sequence that fit as it is, and the fewest GPUs (data-parallel replicas, sharded) that fit."""
    if not isinstance(scenario, Scenario):
        scenario = Scenario.from_dict(scenario)
    if not 0 <= headroom < 1:
        raise ScenarioError("headroom", f"must be in [0, 1), got {headroom!r}")
    before = estimate(scenario)
    base_time = _step_time(scenario)
    groups = levers(scenario)
    rec = Recommendation(scenario, before, headroom)

    def change(opts: tuple[Option, ...]) -> Change | None:
        if any(o.lever == "zero" for o in opts):  # offload rides on the chosen ZeRO stage
            opts = tuple(
                Option(o.lever, "optimizer offload to CPU", {"parallel.offload": "optimizer"}, o.cost)
                if o.lever == "offload"
                else o
                for o in opts
            )
        merged: dict[str, Any] = {}
        for o in opts:
            merged.update(o.changes)
        try:
            sc = _set(scenario, merged)
            after = estimate(sc)
        except ScenarioError:
            return None
        return Change(opts, sc, before, after, headroom, _step_time(sc) / base_time)

    def order(c: Change) -> tuple:
        return (any(o.changes_the_job for o in c.options), c.slowdown, -c.saved_bytes)

    singles = [c for opts in _combos(groups, 1) if (c := change(opts)) is not None]
    useless = {id(c.options[0]) for c in singles if c.saved_bytes <= 0}  # saves nothing here: not offered
    groups = {k: [o for o in v if id(o) not in useless] for k, v in groups.items()}
    groups = {k: v for k, v in groups.items() if v}
    rec.singles = sorted((c for c in singles if c.saved_bytes > 0), key=lambda c: -c.saved_bytes)

    def smallest(levers_: dict[str, list[Option]]) -> list[Change]:
        for size in range(1, min(MAX_LEVERS, len(levers_)) + 1):
            found = [c for opts in _combos(levers_, size) if (c := change(opts)) is not None and c.fits]
            if found:
                return sorted(found, key=order)
        return []

    if not rec.fits:
        # fixes that keep the job (full training stays full training) first; then, if changing the
        # method fits with fewer levers or nothing else does, the smallest fixes that change it
        same_job = smallest({k: v for k, v in groups.items() if k != "method"})
        other = smallest(groups) if "method" in groups else []
        other = [c for c in other if any(o.changes_the_job for o in c.options)]
        if same_job and other and len(other[0].options) >= len(same_job[0].options):
            other = other[:3]
        rec.changes = same_job[:10] + other[:5]
        if rec.changes:
            fixed = rec.changes[0].scenario
            rec.with_first_fix = {
                "change": rec.changes[0].label,
                "max_micro_batch": _largest(
                    lambda b: _fits(fixed.replace(micro_batch_size=b), headroom), 1, MAX_MICRO_BATCH
                ),
            }

    ctx = Context(scenario)
    rec.max_micro_batch = _largest(
        lambda b: _fits(scenario.replace(micro_batch_size=b), headroom), 1, MAX_MICRO_BATCH
    )
    if ctx.arch.fixed_seq_len is None:
        rec.max_seq_len = _max_seq_len(scenario, ctx.arch.max_seq_len, headroom)
    rec.min_gpus = _min_gpus(scenario, headroom)
    if rec.min_gpus is None:
        rec.min_gpus_reason = _why_no_gpu_count(scenario, headroom)
    return rec


def _max_seq_len(scenario: Scenario, table: int | None, headroom: float) -> int | None:
    """The longest sequence that fits: multiples of 128 x cp up to what the model's position table allows
    (``table``, learned positions; None: no bound but MAX_SEQ_LEN), else that bound itself when it fits."""
    step = max(scenario.parallel.cp, 1) * 128
    top = min(MAX_SEQ_LEN, table) if table else MAX_SEQ_LEN
    # GRPO/PPO: the sequence is prompt + a fixed completion, so it starts above the completion
    lo = scenario.rl_config.completion_len // step + 1 if scenario.objective_name in ("grpo", "ppo") else 1
    if lo > top // step:
        return None
    best = _largest(lambda k: _fits(scenario.replace(seq_len=k * step), headroom), lo, top // step)
    longest = best * step if best else None
    # a bound between two steps (a 200-row table): the bound itself when everything below it fits
    at_bound = bool(top % step) and top % scenario.parallel.cp == 0 and longest in (None, top // step * step)
    return top if at_bound and _fits(scenario.replace(seq_len=top), headroom) else longest


def _why_no_gpu_count(scenario: Scenario, headroom: float) -> str:
    """Why more data-parallel GPUs cannot make ``scenario`` fit: what stays on every GPU however wide."""
    wide = estimate(scenario.replace(parallel={"dp": MAX_DP, "zero": 3, "offload": "none", "ep": 1}))
    comps = wide.components()
    biggest = max(comps, key=comps.get)  # type: ignore[arg-type]
    return (
        f"even sharded over {MAX_DP} data-parallel ranks with ZeRO-3 each GPU needs "
        f"{wide.device_total_bytes / GiB:.1f} GiB ({biggest}: {comps[biggest] / GiB:.1f} GiB, which does not "
        f"shard over data parallelism); change a lever first (see the recommendations)"
    )


def _min_gpus(scenario: Scenario, headroom: float) -> dict[str, Any] | None:
    """The fewest GPUs that fit: the layout kept, data parallelism grown (ZeRO-3 when it was ZeRO-0,
    since unsharded replicas never get smaller)."""
    par = scenario.parallel
    zero = par.zero if par.zero else 3
    other = par.tp * par.pp * par.cp

    def at(dp: int) -> Scenario:
        z = zero if dp * par.cp > 1 else 0
        off = par.offload if z else "none"
        if off == "optimizer+params" and z != 3:
            off = "optimizer"
        ep = par.ep if (dp * par.cp) % par.ep == 0 else 1
        return scenario.replace(parallel={"dp": dp, "zero": z, "offload": off, "ep": ep})

    def found(d: int) -> dict[str, Any]:
        cand = at(d)
        return {
            "num_gpus": d * other,
            "dp": d,
            "zero": cand.parallel.zero,
            "device_total_bytes": estimate(cand).device_total_bytes,
            "scenario": cand.to_dict(),
        }

    d = _smallest(lambda dp: _fits(at(dp), headroom), 1, MAX_DP)
    return None if d is None else found(d)
