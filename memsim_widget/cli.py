"""The ``memsim`` command line: estimate a scenario, list presets and GPUs.

Bad input exits with status 2 and one line naming the field; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from memsim_widget.errors import ScenarioError
from memsim_widget.jsonio import read_json_object

GiB = 1024**3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"memsim: error: {message}\n")


#: CLI flag -> (scenario key path, type)
OVERRIDES: dict[str, tuple[str, type]] = {
    "model": ("model", str),
    "gpu": ("gpu", str),
    "method": ("method", str),
    "precision": ("precision", str),
    "optimizer": ("optimizer", str),
    "optimizer_impl": ("optimizer_impl", str),
    "micro_batch_size": ("micro_batch_size", int),
    "seq_len": ("seq_len", int),
    "grad_accum_steps": ("grad_accum_steps", int),
    "activation_checkpointing": ("activation_checkpointing", str),
    "attention": ("attention", str),
    "loss": ("loss", str),
    "framework": ("framework", str),
    "lora_rank": ("lora.rank", int),
    "dp": ("parallel.dp", int),
    "tp": ("parallel.tp", int),
    "pp": ("parallel.pp", int),
    "cp": ("parallel.cp", int),
    "ep": ("parallel.ep", int),
    "zero": ("parallel.zero", int),
    "offload": ("parallel.offload", str),
}


def _read_scenario(path: str | None) -> dict[str, Any]:
    """The scenario file (or stdin for ``-``) as a dict; no file means all defaults."""
    return {} if path is None else read_json_object(path, "scenario")


def _apply_overrides(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    for flag, (key, _) in OVERRIDES.items():
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
    return data


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f}"


def _table(est: Any) -> str:
    """A plain-text report: headline counters, then the worst rank's breakdown with formulas."""
    r = est.worst
    lines = [
        f"model     {est.scenario.to_dict()['model'] if isinstance(est.scenario.model, str) else 'custom'}"
        f" ({est.arch.family}, {est.parameters:,} parameters, {est.trainable_parameters:,} trainable)",
        f"gpu       {est.gpu.name} ({_gib(est.gpu.memory_bytes)} GiB) x {est.scenario.parallel.world_size}",
        f"peak      {est.peak_phase} on {r.label}",
        f"  tensors    {_gib(est.peak_tensor_bytes):>10} GiB  (live tensors, as a fake-tensor trace sees them)",
        f"  allocated  {_gib(est.peak_allocated_bytes):>10} GiB  (torch.cuda.max_memory_allocated)",
        f"  reserved   {_gib(est.peak_reserved_bytes):>10} GiB  (torch.cuda.max_memory_reserved)",
        f"  device     {_gib(est.device_total_bytes):>10} GiB  (nvidia-smi)",
        f"verdict   {est.verdict()} (10% headroom; recommended >= {_gib(est.recommended_memory_bytes())} GiB)",
        "",
        f"{'category':<17} {'GiB':>9}  item / formula",
    ]
    for row in sorted(est.rows(), key=lambda x: (x["stage"], x["category"], -x["bytes"])):
        if row["stage"] != r.stage.index or row["bytes"] == 0:
            continue
        lines.append(f"{row['category']:<17} {row['gib']:>9.3f}  {row['item']}: {row['formula']}")
    if len(est.ranks) > 1:
        lines.append("")
        lines.append(
            "per stage: "
            + ", ".join(f"{x.label} {_gib(x.device_total_bytes)} GiB at {x.peak_phase}" for x in est.ranks)
        )
    return "\n".join(lines)


def cmd_estimate(args: argparse.Namespace) -> int:
    from memsim_widget.engine.core import estimate
    from memsim_widget.scenario import Scenario

    data = _apply_overrides(_read_scenario(args.scenario), args)
    est = estimate(Scenario.from_dict(data))
    if args.json:
        print(json.dumps(est.to_dict(headroom=args.headroom), indent=2))
    else:
        print(_table(est))
    return 0


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
    if not callable(factory):
        raise ScenarioError(flag, f"{spec!r} is not callable")
    return factory


def cmd_trace(args: argparse.Namespace) -> int:
    """Trace the scenario's training step on fake tensors and print measured next to simulated."""
    from memsim_widget.engine.core import estimate
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import check_traceable, trace_report, trace_scenario

    sc = Scenario.from_dict(_apply_overrides(_read_scenario(args.scenario), args))
    check_traceable(sc)
    model_factory = _load_factory(args.module, "--module") if args.module else None
    input_factory = _load_factory(args.inputs, "--inputs") if args.inputs else None
    if (model_factory is None) != (input_factory is None):
        raise ScenarioError("--module", "a user module needs both --module and --inputs")
    result = trace_scenario(sc, model_factory, input_factory, progress=sys.stderr.isatty() and not args.json)
    report = trace_report(sc, result)
    est = estimate(sc)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    err = (est.peak_tensor_bytes - result.peak_bytes) / max(result.peak_bytes, 1)
    print(
        f"traced    {_gib(result.peak_bytes)} GiB live tensors at {result.peak_phase} ({result.peak_op}), "
        f"step {result.peak_step}; step 1 peaked at {_gib(result.step1_peak_bytes)} GiB"
    )
    print(f"simulated {_gib(est.peak_tensor_bytes)} GiB at {est.peak_phase} (error {err:+.2%})")
    print(f"\n{'category':<17} {'traced GiB':>11} {'simulated GiB':>14}")
    sim = report["simulated"]["components"]
    for cat in sorted(set(report["components"]) | set(sim)):
        print(f"{cat:<17} {report['components'].get(cat, 0) / GiB:>11.3f} {sim.get(cat, 0) / GiB:>14.3f}")
    print("\nlargest tensors alive at the peak:")
    for t in result.top[:8]:
        print(
            f"  {t['bytes'] / GiB:>8.3f} GiB  {t['role']:<16} {t['dtype']:<9} {t['shape']}  {t['op']} {t['module']}"
        )
    for note in result.notes:
        print(f"note: {note}")
    return 0


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
            print(f"{g.id:<16} {g.memory_gib:>7.1f} GiB  {g.name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="memsim", description="Simulate the GPU memory of a training step.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    est = sub.add_parser("estimate", help="estimate one scenario (JSON file, '-' for stdin, or defaults)")
    est.add_argument("scenario", nargs="?", help="scenario JSON file, or '-' to read stdin")
    est.add_argument("--json", action="store_true", help="print one JSON object")
    est.add_argument(
        "--headroom", type=float, default=0.10, help="share of GPU memory kept free (default 0.10)"
    )
    for flag, (key, typ) in OVERRIDES.items():
        est.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, help=f"override {key}")
    est.set_defaults(func=cmd_estimate)
    tr = sub.add_parser("trace", help="trace the training step on fake tensors (needs the [trace] extra)")
    tr.add_argument("scenario", nargs="?", help="scenario JSON file, or '-' to read stdin")
    tr.add_argument(
        "--module", help="your own model: FILE.py:NAME or MODULE:NAME, a factory returning an nn.Module"
    )
    tr.add_argument("--inputs", help="its inputs: FILE.py:NAME, a factory returning the forward's arguments")
    tr.add_argument(
        "--json", action="store_true", help="print one JSON object (with timeline and top tensors)"
    )
    for flag, (key, typ) in OVERRIDES.items():
        tr.add_argument("--" + flag.replace("_", "-"), dest=flag, type=typ, help=f"override {key}")
    tr.set_defaults(func=cmd_trace)
    for name, func, text in (("presets", cmd_presets, "list model presets"), ("gpus", cmd_gpus, "list GPUs")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memsim`` script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ScenarioError as exc:
        print(f"memsim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
