"""The ``memsim`` command line: estimate, plan, recommend, export and import launch configs, measure on the local
GPU, list presets and GPUs, serve the page.

Bad input exits with status 2 and one line naming the field; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from memsim_widget.errors import ScenarioError, short_repr
from memsim_widget.jsonio import read_json_object
from memsim_widget.scenario_schema import cli_fields
from memsim_widget.units import GiB


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"memsim: error: {message}\n")


#: CLI flag -> (scenario key path, type), generated from the scenario schema (``scenario_schema.SCHEMA``).
OVERRIDES: dict[str, tuple[str, type]] = {f.cli: (f.key, f.type) for f in cli_fields() if f.cli is not None}


def _bool_arg(text: str) -> bool:
    """A true/false flag value (``--reshard-after-forward false``)."""
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {short_repr(text)}")


def _int_arg(text: str) -> int:
    """An integer flag (argparse names the flag); a 5,000-digit value is summarised, not echoed."""
    try:
        return int(text)
    except ValueError:
        digits = text.strip().lstrip("+-")
        got = f"a number of {len(digits):,} digits" if digits.isdigit() else short_repr(text)
        raise argparse.ArgumentTypeError(f"expected an integer, got {got}") from None


def _headroom_arg(text: str) -> float:
    """``--headroom``: the scenario's one headroom check, in [0, 1) (1 leaves nothing usable)."""
    from memsim_widget.scenario import check_headroom

    try:
        value: Any = float(text)
    except ValueError:
        value = text
    try:
        return check_headroom(value)
    except ScenarioError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _gib_arg(text: str) -> float:
    """``--gpu-memory``: a number of GiB (the custom GPU checks its range)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of GiB, e.g. 48, got {short_repr(text)}"
        ) from None


_ARG_TYPES: dict[type, Any] = {int: _int_arg, bool: _bool_arg}


def _read_scenario(path: str | None) -> dict[str, Any]:
    """The scenario file (or stdin for ``-``) as a dict; no file means all defaults."""
    return {} if path is None else read_json_object(path, "scenario")


def _read_base(
    args: argparse.Namespace, path: str | None, flags: dict[str, tuple[str, type]] = OVERRIDES
) -> dict[str, Any]:
    """The scenario file, or with ``--from FILE...`` the user's launch configs read as one (memsim import)."""
    files = getattr(args, "from_files", None)
    if not files:
        return _read_scenario(path)
    if path is not None:
        raise ScenarioError("--from", "give a scenario JSON or --from FILE..., not both")
    from memsim_widget.import_cli import imported_base

    return imported_base(files, args.from_format, _apply_overrides({}, args, flags))


def _apply_overrides(
    data: dict[str, Any], args: argparse.Namespace, flags: dict[str, tuple[str, type]] = OVERRIDES
) -> dict[str, Any]:
    """``data`` with the scenario keys of the given flags set (dotted keys make nested objects)."""
    for flag, (key, _) in flags.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        target = data
        *parents, leaf = key.split(".")
        for p in parents:
            target = target.setdefault(p, {})
            if not isinstance(target, dict):
                raise ScenarioError(p, "must be a JSON object")
        target[leaf] = value
    return _custom_gpu(data, args)


def _custom_gpu(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``--gpu-memory N``: a card known only by its memory, ``{"memory_gib": N}``, for the scenario's gpu."""
    gib = getattr(args, "gpu_memory", None)
    if gib is not None:
        if getattr(args, "gpu", None) is not None:
            raise ScenarioError("--gpu-memory", "give --gpu (a catalog card) or --gpu-memory (GiB), not both")
        data["gpu"] = {"memory_gib": gib}
    return data


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f}"


def _table(est: Any, headroom: float) -> str:
    """A plain-text report: headline counters, then the worst rank's breakdown with formulas."""
    r = est.worst
    lines = [
        f"model     {est.scenario.to_dict()['model'] if isinstance(est.scenario.model, str) else 'custom'}"
        f" ({est.arch.family}, {est.parameters:,} parameters, {est.trainable_parameters:,} trainable)",
        *(
            [f"attention {att['used']} (requested {att['requested']}: {att['why']})"]
            if (att := est.attention)["used"] != att["requested"]
            else []
        ),
        f"gpu       {est.gpu.name} ({_gib(est.gpu.memory_bytes)} GiB) x {est.scenario.parallel.world_size}",
        f"peak      {est.peak_phase} on {r.label}",
        *_counter_lines(est),
        f"verdict   {est.verdict(headroom)} ({headroom:.0%} headroom; "
        f"recommended >= {_gib(est.recommended_memory_bytes(headroom))} GiB)",
        *([f"          {t}"] if (t := est.verdict_text) else []),
        *(f"caveat    {c}" for c in est.caveats),
        f"time      {est.step_time_s:,.3f} s/step, {est.tokens_per_second_per_gpu:,.0f} tokens/s/GPU, "
        f"MFU {est.mfu:.1%} (modelled; " + _time_split(est) + ")",
        *(f"          time caveat: {c}" for c in est.time_caveats),
        "",
        f"{'category':<17} {'GiB':>9}  item / formula",
    ]
    for row in sorted(est.rows(), key=lambda x: (x["stage"], x["category"], -x["bytes"])):
        if row["stage"] != r.stage.index or row["bytes"] == 0:
            continue
        lines.append(f"{row['category']:<17} {row['gib']:>9.3f}  {row['item']}: {row['formula']}")
    if est.scenario.objective_name != "sft":
        lines += ["", *_phase_lines(est)]
    if len(est.ranks) > 1:
        lines.append("")
        lines.append(
            "per stage: "
            + ", ".join(f"{x.label} {_gib(x.device_total_bytes)} GiB at {x.peak_phase}" for x in est.ranks)
        )
    return "\n".join(lines)


#: The headline counters in the text report: (key, label, what measures it).
_COUNTER_LINES = (
    ("peak_tensor_bytes", "tensors", "live tensors, as a fake-tensor trace sees them"),
    ("peak_allocated_bytes", "allocated", "torch.cuda.max_memory_allocated"),
    ("peak_reserved_bytes", "reserved", "torch.cuda.max_memory_reserved"),
    ("device_total_bytes", "device", "nvidia-smi"),
)


def _counter_lines(est: Any) -> list[str]:
    """One line per headline counter; with several pipeline stages each names the stage it comes from
    (per counter, the worst stage)."""
    staged = len(est.ranks) > 1
    lines = []
    for key, label, what in _COUNTER_LINES:
        rank = est.worst_for(key)
        where = f" on {rank.label}" if staged else ""
        lines.append(f"  {label:<10} {_gib(rank.counter(key)):>10} GiB  ({what}){where}")
    return lines


def _phase_lines(est: Any) -> list[str]:
    """An objective's phases: each phase's peak moment and bytes, then its breakdown (the larger one is the peak)."""
    sc = est.scenario
    rl = sc.rl_config
    lines = [
        f"objective {sc.objective_name}: {sc.sequences_per_micro_batch} sequences per micro-batch, "
        f"reference {sc.reference}"
        + (f", rollout {rl.rollout}" if sc.objective_name in ("grpo", "ppo") else ""),
        "phases    (the peak is the larger phase)",
    ]
    phases = est.phases()
    for name, p in phases.items():
        mark = "  <- peak" if p["peak"] else ""
        lines.append(f"  {name:<13} {_gib(p['allocated_bytes']):>10} GiB allocated at {p['moment']}{mark}")
    for phase in ("rollout", "training"):
        rows = [r for r in est.phase_rows() if r["phase"] == phase]
        if not rows:
            continue
        lines += ["", f"{phase} phase at {rows[0]['moment']}", f"{'category':<17} {'GiB':>9}  item / formula"]
        for row in sorted(rows, key=lambda x: (x["category"], -x["bytes"])):
            lines.append(f"{row['category']:<17} {row['gib']:>9.3f}  {row['item']}: {row['formula']}")
    group = phases.get("rollout_group")
    if group:
        lines += ["", "rollout GPU group (separate cards, not in the training peak)"]
        lines += [f"  {k:<40} {_gib(v):>9} GiB" for k, v in group["items"].items()]
    return lines


def _time_split(est: Any) -> str:
    """The largest step-time categories, as shares."""
    cats = sorted(est.time.categories().items(), key=lambda kv: -kv[1])
    step = est.step_time_s or 1.0
    return ", ".join(f"{k} {v / step:.0%}" for k, v in cats[:4] if v > 0)


def cmd_estimate(args: argparse.Namespace) -> int:
    from memsim_widget.engine.core import estimate
    from memsim_widget.scenario import Scenario

    data = _apply_overrides(_read_base(args, args.scenario), args)
    est = estimate(Scenario.from_dict(data))
    cost = _cost(est, args)
    if args.json:
        out = est.to_dict(headroom=args.headroom)
        if cost is not None:
            out["cost"] = cost.to_dict()
        print(json.dumps(out, indent=2))
    else:
        text = _table(est, args.headroom)
        if cost is not None:
            head, _, rest = text.partition("\n\n")
            line = (f"cost      {cost.tokens:,.0f} tokens: {cost.wall_hours:,.3g} h on {cost.num_gpus} GPUs, "
                    f"{cost.gpu_hours:,.3g} GPU-hours, ${cost.dollars:,.0f} at ${cost.price_per_gpu_hour:g}/GPU-hour "
                    f"({cost.price_source})")  # fmt: skip
            text = f"{head}\n{line}\n\n{rest}"
        print(text)
    return 0


def _cost(est: Any, args: argparse.Namespace) -> Any:
    """Hours and dollars when ``--train-tokens`` or ``--epochs``/``--dataset-tokens`` are given, else None."""
    tokens = getattr(args, "train_tokens", None)
    epochs, data = getattr(args, "epochs", None), getattr(args, "dataset_tokens", None)
    if tokens is None and epochs is None and data is None:
        return None
    from memsim_widget.cost import training_cost

    return training_cost(est, tokens, epochs=epochs, dataset_tokens=data, price=getattr(args, "price", None))


def _load_factory(spec: str, flag: str) -> Any:
    """Import ``path/to/file.py:name`` or ``package.module:name`` (the user's own local code)."""
    import importlib
    import importlib.util

    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ScenarioError(flag, f"expected FILE.py:NAME or MODULE:NAME, got {spec!r}")
    try:
        if target.endswith(".py"):
            loader = importlib.util.spec_from_file_location(Path(target).stem, target)
            if loader is None or loader.loader is None:
                raise ImportError(target)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        factory = getattr(module, name)
    except (ImportError, OSError, AttributeError) as exc:
        raise ScenarioError(flag, f"cannot load {spec!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing (SyntaxError, its own raise)
        raise ScenarioError(flag, f"cannot load {spec!r}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not callable(factory):
        raise ScenarioError(flag, f"{spec!r} is not callable")
    return factory


def cmd_trace(args: argparse.Namespace) -> int:
    """Trace the scenario's training step on fake tensors and print measured next to simulated."""
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import trace_report, trace_scenario
    from memsim_widget.trace.traceable import check_traceable

    sc = Scenario.from_dict(_apply_overrides(_read_scenario(args.scenario), args))
    check_traceable(sc)
    model_factory = _load_factory(args.module, "--module") if args.module else None
    input_factory = _load_factory(args.inputs, "--inputs") if args.inputs else None
    if (model_factory is None) != (input_factory is None):
        raise ScenarioError("--module", "a user module needs both --module and --inputs")
    result = trace_scenario(
        sc, model_factory, input_factory, progress=sys.stderr.isatty() and not args.json, rank=args.rank
    )
    report = trace_report(sc, result)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    simulated = report["simulated"]
    err = (simulated["peak_tensor_bytes"] - result.peak_bytes) / max(result.peak_bytes, 1)
    if result.world_size > 1:
        print(f"rank      {result.rank_role}")
    print(
        f"traced    {_gib(result.peak_bytes)} GiB live tensors at {result.peak_phase} ({result.peak_op}), "
        f"step {result.peak_step}; step 1 peaked at {_gib(result.step1_peak_bytes)} GiB"
    )
    print(
        f"simulated {_gib(simulated['peak_tensor_bytes'])} GiB at {simulated['peak_phase']} (error {err:+.2%})"
    )
    print(f"\n{'category':<17} {'traced GiB':>11} {'simulated GiB':>14}")
    sim = report["simulated"]["components"]
    for cat in sorted(set(report["components"]) | set(sim)):
        print(f"{cat:<17} {report['components'].get(cat, 0) / GiB:>11.3f} {sim.get(cat, 0) / GiB:>14.3f}")
    _print_counters(report)
    print("\nlargest tensors alive at the peak:")
    for t in result.top[:8]:
        print(
            f"  {t['bytes'] / GiB:>8.3f} GiB  {t['role']:<16} {t['dtype']:<9} {t['shape']}  {t['op']} {t['module']}"
        )
    for note in result.notes:
        print(f"note: {note}")
    return 0


def _print_counters(report: dict) -> None:
    """The three GPU counters: the traced run's by replay through the caching allocator, and the simulation's."""
    from memsim_widget.trace.replay import on_card_text

    counters, sim = report.get("counters") or {}, report["simulated"]
    if not counters:
        return
    print(f"\n{'counter':<17} {'replayed GiB':>12} {'simulated GiB':>14}")
    for key, label in (("peak_allocated_bytes", "allocated"), ("peak_reserved_bytes", "reserved"),
                       ("device_total_bytes", "nvidia-smi")):  # fmt: skip
        print(f"{label:<17} {counters[key] / GiB:>12.3f} {sim.get(key, 0) / GiB:>14.3f}")
    print(on_card_text(counters.get("on_card")))


# ----- memsim plan / memsim recommend --------------------------------------------------------------------
#: ``memsim plan`` flags that narrow the search space: flag -> (SearchSpace field, item type).
SPACE_FLAGS: dict[str, tuple[str, type]] = {
    "tp": ("tp", int),
    "pp": ("pp", int),
    "cp": ("cp", int),
    "ep": ("ep", int),
    "zero": ("zero", int),
    "sequence_parallel": ("sequence_parallel", bool),
    "micro_batch": ("micro_batch", int),
    "checkpointing": ("checkpointing", str),
    "loss": ("loss", str),
    "optimizer": ("optimizers", str),
    "offload": ("offload", str),
}
#: ``memsim plan`` flags that fix a scenario key of the job (the rest of the scenario comes from the file).
PLAN_FIXED: dict[str, tuple[str, type]] = {
    flag: OVERRIDES[flag]
    for flag in (
        "model",
        "gpu",
        "method",
        "precision",
        "seq_len",
        "framework",
        "attention",
        "output_lifetime",
        "ssm_kernel",
        "lora_rank",
    )
}
_BOOLS = {
    "true": True,
    "on": True,
    "yes": True,
    "1": True,
    "false": False,
    "off": False,
    "no": False,
    "0": False,
}


#: The most GPU counts one ``plan`` searches (a range LOW-HIGH tries at most 21 powers of two): each count is a
#: full search of layouts, 2,000 of them took 87 s and 5 GB.
MAX_GPU_COUNTS = 32
#: The most candidates ``--top`` lists (the table or JSON of more is no longer read by anyone).
MAX_TOP = 1000


def parse_gpus(text: str) -> int | tuple[int, int] | list[int]:
    """``--gpus``: ``N``, a range ``LOW-HIGH`` (powers of two within it and both ends) or a list ``A,B,C``."""
    from memsim_widget.scenario import MAX_GPUS

    t = text.strip()
    try:
        if "-" in t:
            lo, hi = t.split("-")
            counts: Any = (int(lo), int(hi))
        elif "," in t:
            counts = [int(x) for x in t.split(",")]
        else:
            counts = int(t)
    except ValueError:
        raise ScenarioError(
            "gpus", f"expected N, LOW-HIGH or a comma list like 8,16,32, got {short_repr(text)}"
        ) from None
    if not all(1 <= n <= MAX_GPUS for n in (counts if isinstance(counts, tuple | list) else [counts])):
        raise ScenarioError("gpus", f"GPU counts must be from 1 to {MAX_GPUS:,}, got {short_repr(text)}")
    if isinstance(counts, list) and len(set(counts)) > MAX_GPU_COUNTS:
        raise ScenarioError(
            "gpus", f"at most {MAX_GPU_COUNTS} GPU counts per search, got {len(set(counts)):,} (each count is a "
            "whole search: split the list, or give a range LOW-HIGH, which tries the powers of two)"
        )  # fmt: skip
    return counts


def _list(text: str, field: str, typ: type) -> tuple[Any, ...]:
    """A comma list of one SearchSpace field (``space.<field>`` names it in errors)."""
    items = [x.strip() for x in text.split(",")]
    try:
        if typ is bool:
            return tuple(_BOOLS[x.lower()] for x in items)
        return tuple(typ(x) for x in items)
    except (KeyError, ValueError):
        kind = "true/false" if typ is bool else typ.__name__
        raise ScenarioError(
            f"space.{field}", f"expected a comma list of {kind} values, got {short_repr(text)}"
        ) from None


def _plan_space(args: argparse.Namespace, base: dict[str, Any]) -> Any:
    """The SearchSpace of ``memsim plan``: defaults narrowed by the flags (and the file's optimizer)."""
    from memsim_widget.plan import SearchSpace

    keys: dict[str, Any] = {}
    for flag, (name, typ) in SPACE_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            keys[name] = _list(value, name, typ)
    if "optimizers" not in keys and isinstance(base.get("optimizer"), str):
        keys["optimizers"] = (base["optimizer"],)  # a file that names its optimizer fixes it
    if args.max_tp is not None:
        keys["max_tp"] = args.max_tp
    return SearchSpace(**keys)


def _plan_table(p: Any, top: int) -> str:
    """The best candidates of a plan, one line each, then the summary line."""
    frame = p.frame.head(top)
    several = len(getattr(p, "bases", ())) > 1  # the search tried several methods: show which
    head = (
        f"{'#':>3} {'method ' if several else ''}{'gpus':>5} {'dp':>4} {'tp':>3} {'pp':>3} {'cp':>3} {'ep':>3} {'zero':>4} {'sp':>3} "
        f"{'b':>3} {'accum':>5} {'ckpt':<9} {'loss':<8} {'optimizer':<16} {'offload':<9} "
        f"{'GiB/GPU':>8} {'tok/s/GPU':>10} {'MFU':>5} {'hours':>9} {'dollars':>10}  peak"
    )
    lines = [head]
    for rank, r in enumerate(frame.itertuples(index=False), start=1):
        accum = max(r.grad_accum_steps, r.pp_microbatches)
        lines.append(
            f"{rank:>3} {f'{r.method:<6} ' if several else ''}{r.num_gpus:>5} {r.dp:>4} {r.tp:>3} {r.pp:>3} {r.cp:>3} {r.ep:>3} {r.zero:>4} "
            f"{'on' if r.sequence_parallel else '-':>3} {r.micro_batch_size:>3} {accum:>5} "
            f"{r.activation_checkpointing:<9} {r.loss:<8} {r.optimizer:<16} {r.offload:<9} "
            f"{r.device_total_gib:>8.2f} {r.tokens_per_gpu_s:>10,.0f} {r.mfu:>5.0%} {r.wall_hours:>9,.3g} "
            f"{r.dollars:>10,.0f}  {r.peak_phase}"
        )
    lines.append("")
    lines.append(
        f"hours and dollars: {_tokens_text(p)} at ${p.price_per_gpu_hour:g} per GPU-hour; ranked by {p.rank_by}"
    )
    lines += [f"assumed: {a}" for a in p.assumptions]
    if untraced := _untraced_text(p):
        lines.append(untraced)
    if len(frame):
        lines.append(_exports_text(p, int(frame["candidate"].iloc[0])))
    lines.append(p.summary())
    return "\n".join(lines)


def _tokens_text(p: Any) -> str:
    """The tokens the plan's hours and dollars are for, in words."""
    from memsim_widget.plan.search import DEFAULT_TRAIN_TOKENS

    n = DEFAULT_TRAIN_TOKENS if p.train_tokens is None else p.train_tokens
    return f"training {n:,.0f} tokens"


def _no_fit_hint(p: Any, args: argparse.Namespace) -> str:
    """What to run when nothing fits: the closest candidate, and ``memsim recommend`` on the job."""
    import numpy as np

    c = p.columns
    lines = []
    if p.evaluated:
        i = int(np.argmin(c["device_total_bytes"]))
        usable = int(c["gpu_memory_bytes"]) * (1 - p.headroom)
        n = int(c["num_gpus"][i])
        offload = f" offload={p.scenario(i).parallel.offload}" if int(c["offload"][i]) else ""
        method = f"{p.scenario(i).method}, " if len(getattr(p, "bases", ())) > 1 else ""
        lines.append(
            f"closest: {method}{n} GPU{'s' if n > 1 else ''} as dp={int(c['dp'][i])} tp={int(c['tp'][i])} "
            f"pp={int(c['pp'][i])} cp={int(c['cp'][i])} zero={int(c['zero'][i])}{offload}: "
            f"{_gib(int(c['device_total_bytes'][i]))} GiB per GPU of {_gib(usable)} GiB usable"
        )
    cmd = ["memsim", "recommend"]
    if args.scenario or args.base:
        cmd.append(args.scenario or args.base)
    for flag in (*PLAN_FIXED, "gpu_memory"):  # the same flags as memsim estimate/recommend
        value = getattr(args, flag, None)
        if value is not None:
            cmd += ["--" + flag.replace("_", "-"), str(value)]
    cmd += ["--dp", str(max(p.gpu_counts))]
    lines.append(
        f"hint: nothing fits with {p.headroom:.0%} headroom; to see the smallest changes that would "
        f"(and the fewest GPUs), run: {' '.join(cmd)}"
    )
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    """Search layouts and memory knobs, print the candidates that fit, best first."""
    from memsim_widget.plan import plan

    if args.scenario and args.base:
        raise ScenarioError("--base", "give the fixed choices once: a SCENARIO.json or --base FILE")
    if not 1 <= args.top <= MAX_TOP:
        raise ScenarioError(
            "--top",
            f"must be a positive integer up to {MAX_TOP:,} (candidates listed), got {short_repr(args.top)}",
        )
    methods = None
    if args.method is not None:  # a list: the search tries each method; one method: fixed (never widened)
        methods = [m.strip() for m in args.method.split(",")]
        args.method = methods[0]
    base = _read_base(args, args.scenario or args.base, PLAN_FIXED)
    data = _apply_overrides(json.loads(json.dumps(base)), args, PLAN_FIXED)
    space = _plan_space(args, base)
    p = plan(
        base=data,
        gpus=parse_gpus(args.gpus),
        global_batch_tokens=args.global_batch_tokens,
        space=space,
        headroom=args.headroom,
        top=args.top,
        methods=methods,
        rank_by=args.rank_by,
        train_tokens=args.train_tokens,
        price=args.price,
    )
    if args.export is not None:
        if not p.fitting:
            raise ScenarioError("--export", "no candidate fits, so there is none to export")
        p = p.for_export(args.export)
        if not p.listed:
            raise ScenarioError("--export", f"no listed candidate can be expressed in {args.export}")
        _export_pick(p, args)
        if p.left_out:  # after the files: a refused --pick stays one line
            print(_left_out_text(p), file=sys.stderr)
        return 0
    if args.json:
        print(json.dumps(p.to_dict(args.top), indent=2))
    else:
        print(_plan_table(p, args.top) if p.fitting else p.summary())
    if not p.fitting:
        print(_no_fit_hint(p, args), file=sys.stderr if args.json else sys.stdout)
    return 0


def _recommend_text(rec: Any) -> str:
    """A readable recommendation: verdict, the changes that fit, how far the scenario goes."""
    est = rec.estimate
    usable = est.gpu.memory_bytes * (1 - rec.headroom)
    sc = rec.scenario
    model = sc.model if isinstance(sc.model, str) else "custom model"
    lines = [
        f"scenario  {model}, {sc.method}, {sc.precision}, micro-batch {sc.micro_batch_size} x "
        f"{sc.seq_len} tokens, on {est.gpu.name} x {sc.parallel.world_size}",
        f"memory    {_gib(est.device_total_bytes)} GiB per GPU (nvidia-smi) at {est.peak_phase}; "
        f"{_gib(usable)} GiB usable with {rec.headroom:.0%} headroom",
        f"verdict   {est.verdict(rec.headroom)}",
        "",
    ]

    def change_lines(changes: list[Any]) -> None:
        for n, c in enumerate(changes, start=1):
            tag = "  [changes the job]" if any(o.changes_the_job for o in c.options) else ""
            lines.append(
                f"{n:>3}. {c.label}{tag}\n"
                f"     saves {_gib(c.saved_bytes)} GiB -> {_gib(c.after.device_total_bytes)} GiB per GPU "
                f"({c.after.verdict(rec.headroom)}), modelled step time x{c.slowdown:.2f}\n"
                f"     cost: {c.cost}"
            )

    if not rec.fits:
        if rec.changes and rec.bound:
            lines.append(f"no change that keeps the job fits: {rec.bound}")
        if rec.changes:
            lines.append(
                "changes that fit (fewest levers first, least slowdown first; changes of the job last):"
            )
            change_lines(rec.changes)
        else:
            lines.append(f"no lever fits: {rec.bound}")
    elif rec.singles:
        lines.append("it fits; what each lever would save:")
        change_lines(rec.singles)
    lines.append("")
    mb = rec.max_micro_batch
    lines.append(f"max micro-batch   {mb if mb is not None else 'none fits'} (this layout)")
    if rec.with_first_fix is not None:
        wf = rec.with_first_fix
        lines.append(
            f"  with change 1    {wf['max_micro_batch'] if wf['max_micro_batch'] is not None else 'none fits'}"
        )
    lines += _reach_lines(rec.max_micro_batch_searched, rec)
    if rec.max_seq_len is not None or not rec.fits:
        lines.append(
            f"max sequence      {rec.max_seq_len if rec.max_seq_len is not None else 'none fits'} (this layout)"
        )
        lines += _reach_lines(rec.max_seq_len_searched, rec)
    lines += _min_gpus_lines(rec)
    card = rec.smallest_card
    if card is not None:
        lines.append(
            f"smallest card     {card['name']}: {_gib(card['device_total_bytes'])} GiB per GPU, as it is"
        )
    elif not rec.fits:
        lines.append("smallest card     none in the catalog holds it as it is")
    return "\n".join(lines)


def _reach_lines(r: Any, rec: Any) -> list[str]:
    """recommend's largest micro-batch / sequence on the same GPUs with any layout (``plan.reach``), in words."""
    n = rec.scenario.parallel.world_size
    if r is None:
        return [
            f"  any layout       none fits on {n} GPU{'s' if n > 1 else ''} (or the planner does not model it)"
        ]
    beyond = f"{r.next_stop} fits no layout" if r.next_stop is not None else "the search's top"
    return [
        f"  any layout       {r.value} on {n} GPU{'s' if n > 1 else ''} as {r.layout}",
        f"                   {_gib(r.estimate.device_total_bytes)} GiB per GPU, {r.tokens_per_gpu_s:,.0f} tokens/s/GPU "
        f"(modelled; the cheapest of {r.reaching:,} that reach it, global batch free; {beyond})",
    ]


def _min_gpus_lines(rec: Any) -> list[str]:
    """recommend's fewest GPUs: with any layout and knobs (``plan.reach.fewest_gpus``), then with the
    scenario's own knobs (layout only) where that answer differs."""
    from memsim_widget.plan.recommend import MAX_LAYOUT_GPUS

    r, mg = rec.min_gpus_searched, rec.min_gpus
    if r is None:
        lines = [
            f"min GPUs          none on up to {MAX_LAYOUT_GPUS} GPUs with any layout and knobs "
            "(or the planner does not model it)"
        ]
    else:
        below = (
            f"{r.next_stop} GPU{'s fit' if r.next_stop > 1 else ' fits'} none"
            if r.next_stop
            else "one GPU is the least"
        )
        lines = [
            f"min GPUs          {r.value} as {r.layout}",
            f"                   {_gib(r.estimate.device_total_bytes)} GiB per GPU, {r.tokens_per_gpu_s:,.0f} tokens/s/GPU "
            f"(modelled; any layout and knobs: the cheapest of {r.reaching:,} that fit, global batch free; {below})",
        ]
    if mg is None:
        if r is not None:
            lines.append(f"  these knobs      none: {rec.min_gpus_reason}")
    elif r is None or mg["num_gpus"] != r.value:
        lines.append(
            f"  these knobs      {mg['num_gpus']} as dp={mg['dp']} tp={mg['tp']} pp={mg['pp']} ZeRO-{mg['zero']} "
            f"(the fastest modelled layout that fits): {_gib(mg['device_total_bytes'])} GiB per GPU"
        )
    if r is None and mg is None:
        lines.append(f"  these knobs      none: {rec.min_gpus_reason}")
    return lines


def cmd_recommend(args: argparse.Namespace) -> int:
    """The smallest changes that make a scenario fit, and how far it can be pushed."""
    from memsim_widget.plan import recommend
    from memsim_widget.scenario import Scenario

    sc = Scenario.from_dict(_apply_overrides(_read_base(args, args.scenario), args))
    rec = recommend(sc, headroom=args.headroom)
    print(json.dumps(rec.to_dict(), indent=2) if args.json else _recommend_text(rec))
    return 0


def _write_export(files: dict[str, str], out: str | None, force: bool = False) -> None:
    """Export files to ``--out`` (``export.files.write_files``: all or none, atomic, no link followed, no file
    replaced without ``--force``; one 'wrote PATH' line each), else to stdout (``==> name <==`` heads when there
    are several)."""
    from memsim_widget.export.files import write_files

    if out is None:
        for n, (name, text) in enumerate(files.items()):
            head = f"{'' if n == 0 else chr(10)}==> {name} <==\n" if len(files) > 1 else ""
            sys.stdout.write(head + text)
        return
    for path in write_files(files, out, force=force):
        print(f"wrote {path}")


def cmd_export(args: argparse.Namespace) -> int:
    """Write the launch config of a scenario for one framework (``memsim_widget.export``)."""
    from memsim_widget.export import export
    from memsim_widget.scenario import Scenario

    sc = Scenario.from_dict(_apply_overrides(_read_scenario(args.scenario), args))
    _write_export(export(sc, args.format), args.out, args.force)
    return 0


def _left_out_text(p: Any) -> str:
    """How many listed candidates the export format cannot express, and why (one line per refusal)."""
    n = sum(v["count"] for v in p.left_out.values())
    lines = [
        f"{n:,} listed candidate{'s' if n != 1 else ''} left out: {p.export_format} cannot express them (--pick "
        f"counts among the {p.listed:,} it can)"
    ]
    lines += [
        f"  {v['count']:,} for {field} (e.g. {v['why']})"
        for field, v in sorted(p.left_out.items(), key=lambda x: -x[1]["count"])
    ]
    return "\n".join(lines)


def _exports_text(p: Any, candidate: int) -> str:
    """Which formats write the launch files of the first listed candidate, and which refuse (by field)."""
    answers = p.export_answers(candidate)
    ok = [f for f, why in answers.items() if why is None]
    no = [f"{f} ({why.split(':', 1)[0]})" for f, why in answers.items() if why is not None]
    text = f"launch files for #1: {', '.join(ok) or 'no format'}"
    if no:
        text += f"; refused by {', '.join(no)}; --export F ranks only what F can express"
    return text


def _untraced_text(p: Any) -> str:
    """The plan's time figures that no published run held (``engine/caveats.untraced_time``), or ''."""
    from memsim_widget.engine.caveats import untraced_time
    from memsim_widget.engine.context import Context

    gpu = Context(p.base).gpu
    labels = []
    for sc in (p.base, *(b for b in p.bases[1:] if b.method == "qlora")):
        labels += [x for x in untraced_time(sc, gpu) if x not in labels]
    frame = p.frame
    if len(frame) and (frame["offload"] != "none").any():
        off = p.base.replace(parallel={"zero": 3, "offload": "optimizer+params"})
        labels += [x for x in untraced_time(off, None) if x.startswith("untraced for offload")]
    return "" if not labels else "time figures (tok/s, MFU, hours, dollars) " + "; ".join(labels)


def _export_pick(p: Any, args: argparse.Namespace) -> None:
    """``memsim plan --export FMT``: the launch config of the ``--pick``-th listed candidate."""
    from memsim_widget.export import export

    frame = p.frame
    if not 1 <= args.pick <= len(frame):
        raise ScenarioError(
            "--pick", f"must be from 1 to {len(frame)} (the listed candidates), got {args.pick}"
        )
    candidate = int(frame["candidate"].iloc[args.pick - 1])
    _write_export(export(p.scenario(candidate), args.export, p.estimate(candidate)), args.out, args.force)


def cmd_presets(args: argparse.Namespace) -> int:
    from memsim_widget.catalog.models import PRESET_INFO, architecture_for, preset_ids

    rows = []
    for pid in preset_ids():
        arch = architecture_for(pid)
        info = PRESET_INFO.get(pid, {})
        rows.append(
            {
                "id": pid,
                "family": arch.family,
                "parameters": arch.parameters,
                "description": info.get("description", ""),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['id']:<26} {row['family']:<8} {row['parameters']:>16,}  {row['description']}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from memsim_widget.catalog.gpus import GPUS

    if args.json:
        print(json.dumps([g.to_dict() for g in GPUS.values()], indent=2))
    else:
        for g in GPUS.values():
            kind = g.memory_source.kind if g.memory_source else "unknown"
            print(f"{g.id:<16} {g.memory_gib:>8.2f} GiB  {kind:<16}  {g.name}")
    return 0


def _add_headroom(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--headroom",
        type=_headroom_arg,
        default=0.10,
        help="share of GPU memory kept free, in [0, 1) (default 0.10)",
    )


def _add_gpu_memory(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu-memory",
        dest="gpu_memory",
        type=_gib_arg,
        metavar="GIB",
        help="a card not in the catalog, by its memory in GiB (e.g. 48); instead of --gpu",
    )


def _add_overrides(p: argparse.ArgumentParser) -> None:
    """The scenario-key flags of estimate, trace and recommend, and --gpu-memory."""
    for flag, (key, typ) in OVERRIDES.items():
        p.add_argument(
            "--" + flag.replace("_", "-"), dest=flag, type=_ARG_TYPES.get(typ, typ), help=f"override {key}"
        )
    _add_gpu_memory(p)


def _formats() -> list[str]:
    """The export formats (a plain dict: the writers themselves load on use)."""
    from memsim_widget.export import FORMATS

    return list(FORMATS)


def _add_estimate(sub: argparse._SubParsersAction) -> None:
    """The ``estimate`` subcommand: one scenario, with the cost flags."""
    est = sub.add_parser("estimate", help="estimate one scenario (JSON file, '-' for stdin, or defaults)")
    est.add_argument("scenario", nargs="?", help="scenario JSON file, or '-' to read stdin")
    est.add_argument("--json", action="store_true", help="print one JSON object")
    _add_headroom(est)
    _add_overrides(est)
    est.add_argument(
        "--train-tokens", type=float, help="tokens to train: adds wall hours, GPU-hours and dollars"
    )
    est.add_argument("--epochs", type=float, help="epochs over --dataset-tokens (instead of --train-tokens)")
    est.add_argument("--dataset-tokens", type=float, help="tokens in one epoch of the dataset")
    est.add_argument("--price", type=float, help="US$ per GPU-hour (default: the package's on-demand table)")
    _add_from(est)
    est.set_defaults(func=cmd_estimate)


def _add_trace(sub: argparse._SubParsersAction) -> None:
    """The ``trace`` subcommand: the step on fake tensors, of a scenario or your own module."""
    tr = sub.add_parser("trace", help="trace the training step on fake tensors (needs the [trace] extra)")
    tr.add_argument("scenario", nargs="?", help="scenario JSON file, or '-' to read stdin")
    tr.add_argument(
        "--module", help="your own model: FILE.py:NAME or MODULE:NAME, a factory returning an nn.Module"
    )
    tr.add_argument("--inputs", help="its inputs: FILE.py:NAME, a factory returning the forward's arguments")
    tr.add_argument(
        "--json", action="store_true", help="print one JSON object (with timeline and top tensors)"
    )
    tr.add_argument(
        "--rank",
        type=_int_arg,
        help="the global rank to trace on a multi-GPU layout (default: the highest-memory stage)",
    )
    _add_overrides(tr)
    tr.set_defaults(func=cmd_trace)


def _add_plan(sub: argparse._SubParsersAction) -> None:
    """The ``plan`` subcommand: the fixed choices, then the searched space, the ranking and the export."""
    pl = sub.add_parser(
        "plan",
        help="search parallel layouts and memory knobs for a model on a GPU type; rank what fits",
        description="Search layouts (dp/tp/pp/cp/ep) and memory knobs (ZeRO, sequence parallel, micro-batch, "
        "checkpointing, loss, optimizer, offload) for the GPU counts given; keep the candidates that fit "
        "with the headroom and rank them by modelled cost (tokens/s per GPU: GPU-hours and dollars), wall time "
        "(tokens/s of the whole job) or memory; each line shows both hours and dollars for --train-tokens. "
        "The scenario file gives the fixed choices (method, precision, framework, lora, ...); "
        "the searched knobs are taken from the space, narrowed by the flags below (a file that names its "
        "optimizer fixes it). Nothing fitting is an answer: exit status 0 and a hint to run recommend.",
    )
    pl.add_argument("scenario", nargs="?", help="scenario JSON with the fixed choices, or '-' to read stdin")
    pl.add_argument("--base", metavar="FILE", help="the same as the SCENARIO argument")
    pl.add_argument(
        "--gpus", default="1", help="GPU counts: N, a range LOW-HIGH (powers of two and both ends), or A,B,C"
    )
    for flag, (key, typ) in PLAN_FIXED.items():
        text = f"fix {key}" + (
            " (a comma list, e.g. full,lora,qlora, searches them)" if flag == "method" else ""
        )
        pl.add_argument("--" + flag.replace("_", "-"), dest=flag, type=_ARG_TYPES.get(typ, typ), help=text)
    _add_gpu_memory(pl)
    pl.add_argument(
        "--global-batch-tokens",
        type=_int_arg,
        help="keep dp x micro-batch x accumulation x seq_len at this many tokens (default: one micro-batch "
        "per replica, pp of them with pipelining)",
    )
    _add_plan_search(pl)
    _add_from(pl)
    pl.set_defaults(func=cmd_plan)


def _add_plan_search(pl: argparse.ArgumentParser) -> None:
    """``plan``'s flags that narrow the searched space, rank the candidates and export one."""
    for flag, (name, typ) in SPACE_FLAGS.items():
        kind = "true/false" if typ is bool else ("names" if typ is str else "integers")
        pl.add_argument(
            "--" + flag.replace("_", "-"), dest=flag, metavar="A,B", help=f"try only these {kind} ({name})"
        )
    pl.add_argument("--max-tp", type=_int_arg, help="largest tensor-parallel group (default 8, one node)")
    _add_headroom(pl)
    pl.add_argument("--top", type=_int_arg, default=20, help="candidates shown (default 20)")
    pl.add_argument(
        "--rank-by", choices=("cost", "time", "memory"), default="cost",
        help="cost: fewest GPU-hours (default); time: fewest wall hours; memory: least memory per GPU",
    )  # fmt: skip
    pl.add_argument(
        "--train-tokens", type=float, help="tokens to train, for the hours and dollars (default 1e9)"
    )
    pl.add_argument("--price", type=float, help="US$ per GPU-hour (default: the package's on-demand table)")
    pl.add_argument("--json", action="store_true", help="print one JSON object with the top candidates")
    pl.add_argument(
        "--export",
        choices=_formats(),
        metavar="FORMAT",
        help=f"write the launch config of a listed candidate instead: {', '.join(_formats())}",
    )
    pl.add_argument(
        "--pick", type=_int_arg, default=1, help="the candidate to --export, by its # (default 1)"
    )
    pl.add_argument("--out", metavar="DIR", help="with --export: write the files into DIR (default stdout)")
    _add_force(pl)


def _add_recommend(sub: argparse._SubParsersAction) -> None:
    """The ``recommend`` subcommand: the smallest changes that make a scenario fit."""
    rc = sub.add_parser(
        "recommend",
        help="the smallest changes that make a scenario fit; max micro-batch, sequence, min GPUs",
    )
    rc.add_argument("scenario", nargs="?", help="scenario JSON file, or '-' to read stdin")
    rc.add_argument("--json", action="store_true", help="print one JSON object")
    _add_headroom(rc)
    _add_overrides(rc)
    _add_from(rc)
    rc.set_defaults(func=cmd_recommend)


def _add_export(sub: argparse._SubParsersAction) -> None:
    """The ``export`` subcommand: the launch config of a scenario for one framework."""
    ex = sub.add_parser(
        "export",
        help="write the launch config of a scenario: " + ", ".join(_formats()),
        description="Write the files that launch the scenario under one framework, each with a note of the "
        "scenario and memsim's predicted peak per GPU. A setting the framework cannot express exits 2 naming "
        "the field, or is listed in the note under 'set by hand'. For a planner candidate: memsim plan "
        "--export FORMAT --pick N.",
    )
    ex.add_argument("scenario", nargs="?", help="scenario JSON file, or '-' to read stdin")
    ex.add_argument("--format", required=True, choices=_formats(), metavar="FORMAT",
                    help="one of: " + ", ".join(_formats()))  # fmt: skip
    ex.add_argument("--out", metavar="DIR", help="write the files into DIR (default: print them)")
    _add_force(ex)
    _add_overrides(ex)
    ex.set_defaults(func=cmd_export)


def _add_force(p: argparse.ArgumentParser) -> None:
    """``--force``: replace files an earlier export left in ``--out`` (never a link; all files or none)."""
    p.add_argument(
        "--force",
        action="store_true",
        help="with --out: replace existing files (default: refuse, write nothing)",
    )


def _add_from(p: argparse.ArgumentParser) -> None:
    from memsim_widget.import_cli import add_from

    add_from(p)


def cmd_import(args: argparse.Namespace) -> int:
    """``memsim import FILE...``: the launch configs as a scenario JSON (memsim_widget.importers)."""
    from memsim_widget.import_cli import cmd_import as run

    return run(args, _apply_overrides({}, args))


def _add_import(sub: argparse._SubParsersAction) -> None:
    from memsim_widget.import_cli import add_import

    add_import(sub, _add_overrides, cmd_import)


def _add_measure(sub: argparse._SubParsersAction) -> None:
    from memsim_widget.measure import add_measure

    add_measure(sub, _add_overrides, _add_from, cmd_measure)


def cmd_measure(args: argparse.Namespace) -> int:
    """``memsim measure``: three real training steps on the local CUDA GPU next to the prediction."""
    from memsim_widget.measure import cmd_measure as run
    from memsim_widget.measure import require_cuda

    reason = require_cuda()  # first: without CUDA, one line and nothing else
    if reason:
        raise ScenarioError("measure", reason)
    return run(args, _apply_overrides(_read_base(args, args.scenario), args))


def _add_lists(sub: argparse._SubParsersAction) -> None:
    """The ``presets`` and ``gpus`` subcommands: list the catalog."""
    for name, func, text in (("presets", cmd_presets, "list model presets"), ("gpus", cmd_gpus, "list GPUs")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)


def cmd_app(args: argparse.Namespace) -> int:
    """Serve the widget as a page on ``--host``:``--port`` (Voila); replaces this process."""
    from memsim_widget.app import serve

    return serve(args.host, args.port, open_browser=args.open)


def _add_app(sub: argparse._SubParsersAction) -> None:
    """The ``app`` subcommand: the widget as a standalone web page, no Jupyter needed."""
    ap = sub.add_parser("app", help="serve the widget as a web page (needs the [app] extra: Voila)")
    ap.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    ap.add_argument("--port", type=_int_arg, default=8866)
    ap.add_argument("--open", action="store_true", help="open the page in the default browser")
    ap.set_defaults(func=cmd_app)


def build_parser() -> argparse.ArgumentParser:
    """The ``memsim`` parser: one subcommand per job, each added by its own function."""
    parser = _Parser(prog="memsim", description="Simulate the GPU memory of a training step.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (
        _add_estimate,
        _add_trace,
        _add_plan,
        _add_recommend,
        _add_export,
        _add_import,
        _add_measure,
        _add_lists,
        _add_app,
    ):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memsim`` script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ScenarioError as exc:
        print("memsim: error: " + " ".join(str(exc).splitlines()), file=sys.stderr)  # one line
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
