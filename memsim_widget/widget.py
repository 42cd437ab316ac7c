"""The ``MemSim`` Jupyter widget: scenario controls synced to Python, which recomputes estimate, table and charts.

Architecture: one ``anywidget.AnyWidget``. The front end (``js/widget.js`` + ``js/widget.css``, shipped in the
wheel as ``memsim_widget/static/``) draws the controls, the verdict, the breakdown table and the charts; the
charts are Vega-Lite specs rendered by vega-embed, which Python hands over once per widget as an ES-module
string bundled by ``vl_convert.javascript_bundle`` (no CDN, no network request). Python is the single source
of truth: the front end only writes ``scenario_data`` (and ``headroom``); every derived trait is recomputed here.

"Verify with trace" (``MemSim.verify`` or the button, which sends a ``{"type": "verify"}`` message) traces the
current scenario in a background thread (``memsim_widget.trace``: two training steps on fake tensors), publishes
its progress in the ``trace`` trait, then shows traced against simulated bytes and the timeline (``trace_view``).
A later scenario change marks that result stale; it never runs on an ordinary update.

"Make it fit" (``fit_open``, ``fit``; ``MemSim.recommend`` / ``apply_recommendation``) shows the planner's
smallest fixing changes (``memsim_widget.plan.recommend``) or, when the scenario fits, how far it can be pushed.
They are computed in a background thread only while the panel is open (on every change then, cached per
scenario), so the ordinary update stays fast. Its "Layouts" part (``layouts``; ``MemSim.plan_layouts`` /
``apply_layout``) runs ``memsim_widget.plan.plan`` on request. Applying either replaces the scenario through
``_submit``, the path of every edit, so controls, verdict and charts follow.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.util
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from memsim_widget import charts as charts_mod
from memsim_widget.catalog.gpus import GPUS, resolve_gpu
from memsim_widget.catalog.models import PRESET_INFO, architecture_for, preset_ids
from memsim_widget.engine.core import estimate as run_estimate
from memsim_widget.engine.items import CATEGORIES, fmt_bytes
from memsim_widget.errors import ScenarioError
from memsim_widget.estimate import COUNTERS, DEFAULT_HEADROOM, Estimate
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.precision import PRECISIONS
from memsim_widget.scenario import (
    ADAPTER_DTYPES,
    ATTENTIONS,
    CHECKPOINTING,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    OFFLOADS,
    OPTIMIZER_IMPLS,
    PP_SCHEDULES,
    ZERO_STAGES,
    Scenario,
)
from memsim_widget.trace import charts as trace_charts
from memsim_widget.trace.api import check_traceable

if TYPE_CHECKING:  # the planner (and numpy) load on first use of "Make it fit", not with the widget
    from memsim_widget.plan import Change, Plan, Recommendation

GiB = 1024**3
#: Keys of a llama-style inline model config that the "custom" model controls edit.
CUSTOM_DIMS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
_NESTED = ("parallel", "lora")
#: Vega-Lite version of the bundled vega-embed (matches ``charts.SCHEMA``).
VL_CONVERT_VERSION = "v6_4"
#: What to install for "Verify with trace".
TRACE_EXTRA = "pip install 'memsim-widget[trace]'"
#: Seconds between two progress updates of a running trace.
TRACE_POLL_S = 0.25
#: Training steps a trace runs (the peak is step 2's, the steady state).
TRACE_STEPS = 2
#: Recommendations kept per widget (scenario and headroom -> ``Recommendation``), so moving a control back
#: and forth with the panel open does not compute them again.
FIT_CACHE = 16
#: Candidate layouts listed with an "Apply" button, and points the candidates chart draws at most.
LAYOUT_ROWS = 5
LAYOUT_POINTS = 600
#: Scenario keys the layout search chooses itself: changing them does not make a search result stale.
LAYOUT_SEARCHED = frozenset(
    {"micro_batch_size", "grad_accum_steps", "activation_checkpointing", "loss", "optimizer", "optimizer_impl",
     "num_gpus", "parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep", "parallel.zero",
     "parallel.sequence_parallel", "parallel.pp_microbatches", "parallel.offload"}
)  # fmt: skip
#: What "Apply" can apply from a recommendation (``MemSim.apply_recommendation``'s ``kind``).
FIT_KINDS = ("change", "lever", "max_micro_batch", "max_seq_len", "min_gpus")


def _asset(name: str) -> Path:
    """A front-end file: the packaged copy (wheel) first, else the repository's ``js/`` (editable install)."""
    packaged = Path(__file__).parent / "static" / name
    if packaged.exists():
        return packaged
    return Path(__file__).resolve().parent.parent / "js" / name


@functools.cache
def vega_bundle() -> str:
    """vega-embed + vega + vega-lite as one ES module exporting ``vegaEmbed`` ('' without vl-convert).

    Bundling takes a few seconds, so the result is cached on disk (``$MEMSIM_CACHE_DIR`` or
    ``~/.cache/memsim-widget``) per vl-convert version.
    """
    try:
        import vl_convert as vlc
    except ImportError:
        return ""
    root = os.environ.get("MEMSIM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memsim-widget"
    )
    path = Path(root) / f"vega-embed-{vlc.__version__}-{VL_CONVERT_VERSION}.js"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        pass
    try:
        src = vlc.javascript_bundle("export { vegaEmbed };\n", vl_version=VL_CONVERT_VERSION)
    except Exception:  # an older vl-convert without this Vega-Lite version: its default one
        src = vlc.javascript_bundle("export { vegaEmbed };\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass
    return src


# ----- pure helpers: diffing, normalising, options --------------------------------------------------------
def flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario dict to dotted keys (``parallel.tp``); ``model`` and ``gpu`` stay whole values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _NESTED and isinstance(value, Mapping):
            for sub, v in value.items():
                out[f"{key}.{sub}"] = v
        else:
            out[key] = value
    return out


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """Dotted keys whose value differs between two scenario dicts (keys missing from ``new`` are unchanged)."""
    before, after = flatten(old), flatten(new)
    return {k for k, v in after.items() if k not in before or before[k] != v}


def merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``changes``; ``parallel`` and ``lora`` merge key by key, other keys replace."""
    out = {k: (dict(v) if isinstance(v, Mapping) and k in _NESTED else v) for k, v in base.items()}
    for key, value in changes.items():
        if key in _NESTED and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _arch(model: Any) -> Any:
    """The architecture of a model input, or None when it cannot be resolved."""
    try:
        return architecture_for(model)
    except Exception:  # any unresolvable input: the scenario check reports it
        return None


def _linear_modules(arch: Any) -> list[str]:
    """Names of the Linear modules of an architecture (LoRA targets)."""
    return sorted({g.module for g in arch.params if g.module}) if arch is not None else []


def normalize(data: Mapping[str, Any], changed: set[str]) -> dict[str, Any]:
    """Reset controls that a change made inapplicable to their neutral value, unless they changed themselves.

    E.g. tp back to 1 turns sequence parallelism off; ZeRO 0 turns offload off; an optimizer without the
    current implementation switches to one it has. A value set explicitly in the same change is kept, so an
    impossible combination typed on purpose still reports its error.
    """
    out = merge(data, {})
    par = out.get("parallel") if isinstance(out.get("parallel"), dict) else {}
    lora = out.get("lora") if isinstance(out.get("lora"), dict) else {}

    def fix(key: str, ok: bool, value: Any) -> None:
        if ok or key in changed:
            return
        section, _, sub = key.partition(".")
        if sub:
            {"parallel": par, "lora": lora}[section][sub] = value
        else:
            out[key] = value

    tp, zero, pp = par.get("tp", 1), par.get("zero", 0), par.get("pp", 1)
    fix("parallel.sequence_parallel", tp != 1 or not par.get("sequence_parallel"), False)
    offload = par.get("offload", "none")
    fix("parallel.offload", zero != 0 or offload == "none", "none")
    offload = par.get("offload", "none")
    fix("parallel.offload", zero in (0, 3) or offload != "optimizer+params", "optimizer")
    schedule = par.get("pp_schedule", "1f1b")
    fix("parallel.pp_schedule", pp != 1 or schedule == "1f1b", "1f1b")
    schedule = par.get("pp_schedule", "1f1b")
    vs = par.get("virtual_stages", 1)
    if schedule == "interleaved":
        fix("parallel.virtual_stages", not isinstance(vs, int) or vs >= 2, 2)
    else:
        fix("parallel.virtual_stages", vs == 1, 1)
    spec = OPTIMIZERS.get(out.get("optimizer"))  # type: ignore[arg-type]
    if spec is not None and spec.impls and out.get("optimizer") != "none":
        fix("optimizer_impl", out.get("optimizer_impl") in spec.impls, spec.impls[0])
    gas = out.get("grad_accum_steps", 1)
    fix(
        "optimizer_in_backward",
        not out.get("optimizer_in_backward") or (gas == 1 and out.get("optimizer") != "none"),
        False,
    )
    arch = _arch(out.get("model"))
    if arch is not None:
        fix("parallel.ep", arch.is_moe or par.get("ep", 1) == 1, 1)
        modules = _linear_modules(arch)
        targets = lora.get("targets")
        if out.get("method") != "full" and isinstance(targets, list | tuple) and targets:
            kept = [t for t in targets if t in modules or t == "all-linear"]
            fix("lora.targets", kept == list(targets), kept or ["all-linear"])
    return out


def disabled_controls(data: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, list[Any]]]:
    """Controls that do not apply to ``data`` (key -> reason) and per-control values that are not offered."""
    par = data.get("parallel") if isinstance(data.get("parallel"), Mapping) else {}
    off: dict[str, str] = {}
    values: dict[str, list[Any]] = {}
    model = data.get("model")
    if not isinstance(model, Mapping):
        for dim in CUSTOM_DIMS:
            off[f"model.{dim}"] = "pick 'custom' as the model to edit its dimensions"
    if not isinstance(data.get("gpu"), Mapping):
        off["gpu.memory_gib"] = "pick 'custom' as the GPU to set its memory"
    if data.get("method", "full") == "full":
        for key in ("lora.rank", "lora.alpha", "lora.targets", "lora.adapter_dtype"):
            off[key] = "LoRA settings apply to method lora or qlora"
    if par.get("tp", 1) == 1:
        off["parallel.sequence_parallel"] = "sequence parallelism needs tp > 1"
    if par.get("zero", 0) == 0:
        off["parallel.offload"] = "offload needs ZeRO stage >= 1"
    elif par.get("zero") != 3:
        values["parallel.offload"] = ["optimizer+params"]
    if par.get("pp", 1) == 1:
        for key in ("parallel.pp_schedule", "parallel.pp_microbatches", "parallel.virtual_stages"):
            off[key] = "pipeline settings need pp > 1"
    elif par.get("pp_schedule") != "interleaved":
        off["parallel.virtual_stages"] = "virtual stages need the interleaved schedule"
    optimizer = data.get("optimizer")
    spec = OPTIMIZERS.get(optimizer)  # type: ignore[arg-type]
    if optimizer == "none":
        off["optimizer_impl"] = "no optimizer step"
        off["optimizer_in_backward"] = "no optimizer step"
    elif spec is not None:
        missing = [impl for impl in OPTIMIZER_IMPLS if impl not in spec.impls]
        if missing:
            values["optimizer_impl"] = missing
    if data.get("grad_accum_steps", 1) != 1:
        off["optimizer_in_backward"] = "stepping in backward cannot accumulate gradients"
    arch = _arch(model)
    if arch is not None:
        if not arch.is_moe:
            off["parallel.ep"] = "expert parallelism needs a mixture-of-experts model"
        if arch.fixed_seq_len:
            off["seq_len"] = f"the model's sequence is fixed ({arch.fixed_seq_len} tokens)"
    return off, values


@functools.cache
def _static_options() -> dict[str, Any]:
    """The parts of ``options`` that never change: presets, GPUs, choices, slider stops, descriptions."""
    presets = []
    for pid in preset_ids():
        info = PRESET_INFO.get(pid, {})
        presets.append(
            {
                "id": pid,
                "params": info.get("params_label", ""),
                "description": info.get("description", ""),
                "label": f"{pid} ({info.get('params_label', '?')}): {info.get('description', '')}",
            }
        )
    return {
        "presets": presets,
        "gpus": [{"id": g.id, "name": g.name, "memory_gib": round(g.memory_gib, 2)} for g in GPUS.values()],
        "choices": {
            "method": list(METHODS),
            "precision": list(PRECISIONS),
            "optimizer": list(OPTIMIZERS),
            "optimizer_impl": list(OPTIMIZER_IMPLS),
            "activation_checkpointing": list(CHECKPOINTING),
            "attention": list(ATTENTIONS),
            "loss": list(LOSSES),
            "framework": list(FRAMEWORKS),
            "lora.adapter_dtype": list(ADAPTER_DTYPES),
            "parallel.zero": list(ZERO_STAGES),
            "parallel.pp_schedule": list(PP_SCHEDULES),
            "parallel.offload": list(OFFLOADS),
        },
        "descriptions": {
            "precision": {k: v.description for k, v in PRECISIONS.items()},
            "optimizer": {k: v.description for k, v in OPTIMIZERS.items()},
        },
        "stops": {
            "micro_batch_size": list(charts_mod.MICRO_BATCH_STOPS),
            "seq_len": list(charts_mod.SEQ_LEN_STOPS),
        },
        "custom_dims": list(CUSTOM_DIMS),
        "categories": list(CATEGORIES),
    }


def build_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ``options`` trait for a (possibly invalid) scenario dict: choices plus what is disabled now."""
    disabled, disabled_values = disabled_controls(data)
    arch = _arch(data.get("model"))
    dims = {}
    if arch is not None:
        dims = {
            "hidden_size": arch.hidden_size,
            "num_hidden_layers": arch.num_layers,
            "num_attention_heads": arch.num_heads,
            "num_key_value_heads": arch.num_kv_heads,
            "intermediate_size": arch.intermediate_size,
            "vocab_size": arch.vocab_size,
        }
    return {
        **_static_options(),
        "disabled": disabled,
        "disabled_values": disabled_values,
        "model_dims": dims,
        "lora_targets": ["all-linear", *_linear_modules(arch)],
        "num_experts": arch.num_experts if arch is not None else 0,
        "fixed_seq_len": arch.fixed_seq_len if arch is not None else None,
    }


def _peak(key: str, label: str, nbytes: int) -> dict[str, Any]:
    """One headline peak with the counter it predicts."""
    return {
        "key": key,
        "label": label,
        "bytes": nbytes,
        "gib": round(nbytes / GiB, 3),
        "size": fmt_bytes(nbytes),
        "counter": COUNTERS[key],
    }


def build_result(est: Estimate, headroom: float, scaling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``result`` trait: verdict, peaks with their counters, bottleneck, per-rank bytes and the breakdown."""
    cap = est.gpu.memory_bytes
    b = est.bottleneck()
    top = b["items"][0] if b["items"] else None
    bottleneck_text = (
        f"{b['category']} dominate {b['rank']} at {b['moment']}: {fmt_bytes(b['bytes'])} ({b['share']:.0%})"
        + (f"; largest item {top['item']} = {top['formula']}" if top else "")
    )
    summary_scaling = {}
    for axis, d in (scaling or {}).items():
        if "crosses_capacity" in d:
            summary_scaling[axis] = {
                "max_fit": d["crosses_headroom"]["max_fit"],
                "exceeds_at": d["crosses_capacity"]["at"],
                "invalid": [i["value"] for i in d["invalid"]],
            }
        elif d.get("fixed"):
            summary_scaling[axis] = {"fixed": d["fixed"]}
    return {
        "verdict": est.verdict(headroom),
        "headroom": headroom,
        "model": charts_mod.model_label(est.scenario.model),
        "family": est.arch.family,
        "parameters": est.parameters,
        "trainable_parameters": est.trainable_parameters,
        "gpu": {
            "id": est.gpu.id,
            "name": est.gpu.name,
            "memory_bytes": cap,
            "memory_gib": round(cap / GiB, 2),
        },
        "usable_bytes": int(cap * (1 - headroom)),
        "peak_moment": est.peak_phase,
        "peak_rank": est.worst.label,
        "peaks": [
            _peak("device_total_bytes", "nvidia-smi", est.device_total_bytes),
            _peak("peak_reserved_bytes", "reserved", est.peak_reserved_bytes),
            _peak("peak_allocated_bytes", "allocated", est.peak_allocated_bytes),
            _peak("peak_tensor_bytes", "tensors", est.peak_tensor_bytes),
        ],
        "recommended_bytes": est.recommended_memory_bytes(headroom),
        "host_bytes": max((r.host_bytes for r in est.ranks), default=0),
        "bottleneck": {**b, "text": bottleneck_text},
        "per_rank": [
            {
                "rank": r.label,
                "stage": r.stage.index,
                "peak_moment": r.peak_phase,
                "device_total_bytes": r.device_total_bytes,
                "components": r.components(),
            }
            for r in est.ranks
        ],
        "rows": [{**row, "gib": round(row["gib"], 4)} for row in est.rows()],
        "scaling": summary_scaling,
        "summary": est.summary(),
    }


def _known(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without unknown keys (top level, ``parallel``, ``lora``): no control can show or remove them."""
    out = {k: v for k, v in data.items() if k in _default_dict()}
    for section in _NESTED:
        if isinstance(out.get(section), Mapping):
            out[section] = {k: v for k, v in out[section].items() if k in _default_dict()[section]}
    return out


@functools.cache
def _default_dict() -> dict[str, Any]:
    """The default scenario as a dict, ``num_gpus`` left to the layout."""
    return {**Scenario().to_dict(), "num_gpus": None}


def _defaults() -> dict[str, Any]:
    """A fresh copy of the default scenario dict (nested sections copied)."""
    return merge(_default_dict(), {})


def _error_text(exc: BaseException | None) -> str:
    """An exception as the panels show it: a ScenarioError's own text, else its type and message."""
    return str(exc) if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"


def _json_text(value: Any, widget: Any) -> str:
    """Send a large derived trait as JSON text: ipywidgets then skips walking it for binary buffers (~4 ms)."""
    return json.dumps(value, separators=(",", ":"))


# ----- verify with trace: availability, progress, the runner and the view ---------------------------------
class TraceCancelled(Exception):
    """A trace stopped because it was cancelled (raised in the trace's thread, or by ``verify``)."""


@functools.cache
def _missing_trace_modules() -> tuple[str, ...]:
    """Modules of the trace extra that are not installed (looked up once, without importing them)."""
    return tuple(name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name) is None)


def trace_check(sc: Scenario) -> ScenarioError | None:
    """Why ``sc`` cannot be traced here (a missing extra, or ``check_traceable``'s error); None when it can."""
    missing = [m for m in _missing_trace_modules() if m != "peft" or sc.method != "full"]
    if missing:
        return ScenarioError("trace", f"needs {' and '.join(missing)}: {TRACE_EXTRA}")
    try:
        check_traceable(sc)
    except ScenarioError as exc:
        return exc
    return None


class TraceProbe:
    """A running trace seen from outside: its stage, the tracker's counters, and a cancel flag.

    ``hook`` is installed as a global module forward pre-hook while the trace runs: in the trace's thread it
    finds the ``MemoryTracker`` on the dispatch-mode stack (so ``snapshot`` can read ops, step, phase and
    bytes from another thread) and raises ``TraceCancelled`` once ``cancel`` is set.
    """

    def __init__(self) -> None:
        """A probe for a trace that has not started yet."""
        self.cancel = threading.Event()
        self.thread_id: int | None = None
        self.stage = "starting"
        self.tracker: Any = None
        self.ops: int | None = None
        self.on_found: Callable[[], None] | None = None
        self.started = time.monotonic()
        self.ended: float | None = None

    def hook(self, module: Any, args: Any) -> None:
        """Forward pre-hook: in the trace's thread, stop if cancelled and find the tracker once."""
        if threading.get_ident() != self.thread_id:
            return
        if self.cancel.is_set():
            raise TraceCancelled("trace cancelled")
        if self.tracker is None:
            from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

            for mode in reversed(_get_current_dispatch_mode_stack()):
                if hasattr(mode, "op_count") and hasattr(mode, "marks") and hasattr(mode, "live_bytes"):
                    self.tracker = mode
                    self.stage = "tracing"
                    if self.on_found is not None:
                        self.on_found()
                    break

    def check(self) -> None:
        """Raise ``TraceCancelled`` if the trace was cancelled."""
        if self.cancel.is_set():
            raise TraceCancelled("trace cancelled")

    def snapshot(self) -> dict[str, Any]:
        """Progress as plain data: stage, elapsed seconds and, once tracing, step, phase, ops, bytes, fraction."""
        end = self.ended if self.ended is not None else time.monotonic()
        out: dict[str, Any] = {
            "stage": self.stage,
            "elapsed_s": round(end - self.started, 1),
            "steps": TRACE_STEPS,
        }
        t = self.tracker
        if t is None:
            if self.ops is not None:
                out["ops"] = self.ops
            return out
        ops = int(t.op_count) if self.ops is None else self.ops
        step = int(t.step)
        out.update(
            ops=ops,
            step=step,
            phase=str(t.phase),
            live_bytes=int(t.live_bytes),
            peak_bytes=int(t.peak_bytes),
        )
        # Step 2 runs the ops of step 1 again: its share of them is the progress of the second half.
        starts = {m["step"]: m["op_index"] for m in list(t.marks) if m["phase"] == "forward"}
        if step >= 2 and 1 in starts and 2 in starts and starts[2] > starts[1]:
            out["fraction"] = round(min(0.99, 0.5 + 0.5 * (ops - starts[2]) / (starts[2] - starts[1])), 3)
        return out


def run_trace(scenario: Scenario, probe: TraceProbe) -> dict[str, Any]:
    """Trace ``scenario`` (two training steps on fake tensors) and return its ``trace_report``.

    Runs in the widget's trace thread; ``probe`` follows it and can cancel it. Tests replace this function.
    """
    probe.stage = "importing torch"
    import torch

    from memsim_widget.trace.api import trace_report, trace_scenario

    probe.check()
    probe.stage = "building the model"
    handle = torch.nn.modules.module.register_module_forward_pre_hook(probe.hook)
    try:
        result = trace_scenario(scenario, progress=False)
    finally:
        handle.remove()
    probe.check()
    probe.ops = int(result.ops)
    probe.stage = "comparing with the simulation"
    report = trace_report(scenario, result)
    del result
    return report


def _pct(value: int, reference: int) -> float | None:
    """``value`` relative to ``reference`` in percent (None when the reference is 0)."""
    return round((value - reference) / reference * 100, 2) + 0.0 if reference else None  # + 0.0: no -0.0


def build_trace_view(report: Mapping[str, Any], seconds: float | None = None) -> dict[str, Any]:
    """The ``trace_view`` trait of a trace report: traced vs simulated peak and per category, and chart specs.

    The error is the simulation's, relative to the trace: ``(simulated - traced) / traced`` in percent.
    """
    traced = int(report["peak_tensor_bytes"])
    sim = report.get("simulated") or {}
    simulated = int(sim.get("peak_tensor_bytes", 0))
    comps, sim_comps = report.get("components") or {}, sim.get("components") or {}
    names = [c for c in CATEGORIES if c in comps or c in sim_comps]
    names += sorted((set(comps) | set(sim_comps)) - set(names))
    categories = []
    for name in names:
        t, s = int(comps.get(name, 0)), int(sim_comps.get(name, 0))
        if t or s:
            categories.append(
                {
                    "category": name,
                    "traced": t,
                    "simulated": s,
                    "traced_size": fmt_bytes(t),
                    "simulated_size": fmt_bytes(s),
                    "error_pct": _pct(s, t),
                }
            )
    scenario = report.get("scenario") or {}
    summary = {
        "model": charts_mod.model_label(scenario.get("model")),
        "scenario": scenario,
        "traced": {
            "bytes": traced,
            "size": fmt_bytes(traced),
            "phase": report.get("peak_phase", ""),
            "op": report.get("peak_op", ""),
            "step": report.get("peak_step"),
        },
        "simulated": {"bytes": simulated, "size": fmt_bytes(simulated), "phase": sim.get("peak_phase", "")},
        "error_pct": _pct(simulated, traced),
        "step1_bytes": report.get("step1_peak_tensor_bytes"),
        "parameters": (report.get("model") or {}).get("parameters"),
        "categories": categories,
        "notes": list(report.get("notes") or []),
        "seconds": seconds,
        "counter": report.get("counter", ""),
    }
    return {"summary": summary, "charts": trace_charts.verify_specs(dict(report), schema=charts_mod.SCHEMA)}


class _TraceJob:
    """One trace run: the scenario, its probe and thread, and the future of its report."""

    def __init__(self, scenario: Scenario, previous: _TraceJob | None = None) -> None:
        """A job for ``scenario``; it starts after ``previous`` (cancelled) has stopped."""
        self.scenario = scenario
        self.data = scenario.to_dict()
        self.previous = previous
        self.probe = TraceProbe()
        self.future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def running(self) -> bool:
        """True until the job's thread has finished."""
        return not self.done.is_set()


# ----- make it fit: recommendations and candidate layouts as trait data ------------------------------------
def plan_recommend(scenario: Scenario, headroom: float) -> Recommendation:
    """``memsim_widget.plan.recommend``, imported on first use (tests replace this function)."""
    from memsim_widget.plan import recommend

    return recommend(scenario, headroom=headroom)


def plan_search(**kwargs: Any) -> Plan:
    """``memsim_widget.plan.plan``, imported on first use (tests replace this function)."""
    from memsim_widget.plan import plan

    return plan(**kwargs)


def _change_view(c: Change, index: int) -> dict[str, Any]:
    """One recommended change (or single lever) as the panel lists it: label, GiB saved, fits, cost in words."""
    return {
        "index": index,
        "label": c.label,
        "cost": c.cost,
        "changes": dict(c.changes),
        "changes_the_job": any(o.changes_the_job for o in c.options),
        "saved_bytes": int(c.saved_bytes),
        "saved_gib": round(c.saved_bytes / GiB, 3),
        "after_bytes": int(c.after.device_total_bytes),
        "after": fmt_bytes(c.after.device_total_bytes),
        "fits": bool(c.fits),
        "verdict": c.after.verdict(c.headroom),
        "slowdown": round(float(c.slowdown), 3),
    }


def build_fit_view(rec: Recommendation) -> dict[str, Any]:
    """The ``view`` of the ``fit`` trait: what fixes ``rec``'s scenario, or how far it can be pushed when it fits.

    Carries no scenarios (Python keeps the ``Recommendation``; "Apply" names an entry by kind and index).
    """
    est, headroom = rec.estimate, rec.headroom
    cap = est.gpu.memory_bytes
    usable = int(cap * (1 - headroom))
    mg = rec.min_gpus
    return {
        "scenario": rec.scenario.to_dict(),
        "headroom": headroom,
        "verdict": est.verdict(headroom),
        "fits": bool(rec.fits),
        "gpu": est.gpu.name,
        "device_total_bytes": int(est.device_total_bytes),
        "gpu_memory_bytes": int(cap),
        "usable_bytes": usable,
        "spare_bytes": usable - int(est.device_total_bytes),
        "changes": [_change_view(c, i) for i, c in enumerate(rec.changes)],
        "levers": [_change_view(c, i) for i, c in enumerate(rec.singles)],
        "micro_batch_size": rec.scenario.micro_batch_size,
        "seq_len": rec.scenario.seq_len,
        "num_gpus": rec.scenario.parallel.world_size,
        "max_micro_batch": rec.max_micro_batch,
        "max_seq_len": rec.max_seq_len,
        "min_gpus": None
        if mg is None
        else {k: mg[k] for k in ("num_gpus", "dp", "zero", "device_total_bytes") if k in mg},
        "with_first_fix": rec.with_first_fix,
        "summary": rec.summary(),
    }


def fit_target(rec: Recommendation, kind: str = "change", index: int = 0) -> Scenario:
    """The scenario "Apply" sets for one entry of a recommendation (``kind`` one of ``FIT_KINDS``).

    ``change``/``lever``: the ``index``-th fixing change / single lever; ``max_micro_batch``, ``max_seq_len``:
    the scenario with the largest micro-batch / sequence that fits; ``min_gpus``: the fewest GPUs that fit.
    Raises ``ScenarioError`` (field ``recommendation``) when there is no such entry.
    """

    def missing(what: str) -> ScenarioError:
        return ScenarioError("recommendation", what)

    if kind in ("change", "lever"):
        items = rec.changes if kind == "change" else rec.singles
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(items):
            raise missing(f"no {kind} number {index!r} (there are {len(items)})")
        return items[index].scenario
    if kind == "max_micro_batch":
        if rec.max_micro_batch is None:
            raise missing("no micro-batch fits")
        return rec.scenario.replace(micro_batch_size=rec.max_micro_batch)
    if kind == "max_seq_len":
        if rec.max_seq_len is None:
            raise missing("no sequence length fits (or the model's sequence is fixed)")
        return rec.scenario.replace(seq_len=rec.max_seq_len)
    if kind == "min_gpus":
        if rec.min_gpus is None:
            raise missing("no number of GPUs fits")
        return Scenario.from_dict(rec.min_gpus["scenario"])
    raise missing(f"kind must be one of {', '.join(FIT_KINDS)}, got {kind!r}")


def build_layouts_view(p: Plan, rows: int = LAYOUT_ROWS, points: int = LAYOUT_POINTS) -> dict[str, Any]:
    """The ``view`` of the ``layouts`` trait: the search in numbers, the best ``rows`` candidates, the chart."""
    from memsim_widget.plan.chart import candidates_spec

    top = []
    for rank, r in enumerate(p.frame.head(rows).itertuples(index=False), start=1):
        top.append(
            {
                "rank": rank,
                "candidate": int(r.candidate),
                "layout": f"dp={r.dp} tp={r.tp} pp={r.pp} cp={r.cp}" + (f" ep={r.ep}" if r.ep > 1 else ""),
                "num_gpus": int(r.num_gpus),
                "dp": int(r.dp),
                "tp": int(r.tp),
                "pp": int(r.pp),
                "cp": int(r.cp),
                "ep": int(r.ep),
                "zero": int(r.zero),
                "sequence_parallel": bool(r.sequence_parallel),
                "micro_batch_size": int(r.micro_batch_size),
                "grad_accum_steps": int(r.grad_accum_steps),
                "pp_microbatches": int(r.pp_microbatches),
                "activation_checkpointing": str(r.activation_checkpointing),
                "loss": str(r.loss),
                "optimizer": str(r.optimizer),
                "offload": str(r.offload),
                "device_total_bytes": int(p.columns["device_total_bytes"][int(r.candidate)]),
                "device_total_gib": round(float(r.device_total_gib), 2),
                "tokens_per_gpu_s": round(float(r.tokens_per_gpu_s), 1),
            }
        )
    return {
        "gpu_counts": list(p.gpu_counts),
        "evaluated": p.evaluated,
        "fitting": p.fitting,
        "seconds": round(p.seconds, 4),
        "summary": p.summary(),
        "model": charts_mod.model_label(p.base.model),
        "gpu": resolve_gpu(p.base.gpu).name,
        "top": top,
        "chart": candidates_spec(p, limit=points),
    }


def layouts_stale_keys(shown: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Keys that differ between the scenario a layout search ran for and ``current``, except the searched ones."""
    keys = changed_keys(shown, current) | changed_keys(current, shown)
    return sorted(k for k in keys if k not in LAYOUT_SEARCHED)


# ----- the widget -----------------------------------------------------------------------------------------
class MemSim(anywidget.AnyWidget):
    """GPU-memory simulator widget: controls for a ``Scenario``, the verdict, breakdown, scaling and table."""

    _esm = _asset("widget.js")
    _css = _asset("widget.css")

    #: The scenario as JSON (every key resolved when valid): the single source of truth for the controls.
    scenario_data = traitlets.Dict().tag(sync=True)
    #: Allowed values per control, presets, GPUs, slider stops, and which controls/values are disabled.
    #: (``options``, ``result`` and ``charts`` are dicts in Python and reach the browser as JSON text.)
    options = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: The last valid result: verdict, peaks with counters, bottleneck, per-rank bytes, breakdown rows.
    result = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Vega-Lite specs: ``breakdown`` and ``scaling``.
    charts = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: ``"<field>: <message>"`` of the last rejected scenario, '' when the scenario is valid.
    error = traitlets.Unicode("").tag(sync=True)
    #: The dotted field the error names (e.g. ``parallel.tp``).
    error_field = traitlets.Unicode("").tag(sync=True)
    #: Share of GPU memory kept free for the verdict (0.10 = 10 %).
    headroom = traitlets.Float(DEFAULT_HEADROOM).tag(sync=True)
    #: vega-embed as an ES-module string ('' if vl-convert is missing: the charts then don't draw).
    _vega_js = traitlets.Unicode("").tag(sync=True)
    #: "Verify with trace": ``state`` (idle, running, cancelling, done, error, cancelled), ``available`` and
    #: ``reason`` (why the button is disabled), ``progress`` (stage, elapsed_s, step, phase, ops, live/peak
    #: bytes, fraction), ``error``, ``stale`` with ``stale_keys`` (the shown trace is of another scenario)
    #: and ``running_stale`` (the running trace is of another scenario).
    trace = traitlets.Dict().tag(sync=True)
    #: The last finished trace: ``summary`` (traced vs simulated peak and per category, error in percent)
    #: and ``charts`` (``comparison`` and ``timeline`` Vega-Lite specs); {} before the first trace.
    trace_view = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Whether the "Make it fit" panel is open (the front end writes it): only then do recommendations follow
    #: every scenario change.
    fit_open = traitlets.Bool(False).tag(sync=True)
    #: "Make it fit": ``state`` (idle, running, done, error), ``error``, ``id`` (of the shown ``view``; "Apply"
    #: names it), ``ms`` (time to compute), ``stale`` (the view is of another scenario or headroom),
    #: ``rejected`` (the input shown is rejected: the view is of the last valid scenario) and ``view``
    #: (``build_fit_view``: changes that fit, single levers, max micro-batch/sequence, min GPUs; None before).
    fit = traitlets.Dict().tag(sync=True, to_json=_json_text)
    #: Candidate layouts (``plan``, on request): ``state`` (idle, running, done, error), ``error``, ``id``, ``ms``,
    #: ``gpus`` (the GPU count searched), ``stale`` with ``stale_keys`` (non-searched keys changed since), and
    #: ``view`` (``build_layouts_view``: counts, summary, the top candidates, the chart's Vega-Lite spec).
    layouts = traitlets.Dict().tag(sync=True, to_json=_json_text)

    def __init__(
        self,
        scenario: Scenario | Mapping[str, Any] | None = None,
        *,
        headroom: float = DEFAULT_HEADROOM,
        charts_js: bool = True,
        **changes: Any,
    ) -> None:
        """Start from a ``Scenario`` or dict (default scenario if None), with keyword changes on top.

        ``charts_js=False`` leaves out the vega-embed bundle (0.9 MB): the browser then draws no charts
        (headless use, tests). An invalid starting scenario raises ``ScenarioError``.
        """
        base = scenario if isinstance(scenario, Scenario) else Scenario.from_dict(scenario or {})
        if changes:
            data = merge(base.to_dict(), changes)
            if "num_gpus" not in changes:
                data.pop("num_gpus")
            base = Scenario.from_dict(data)
        est = run_estimate(base)  # raises ScenarioError: there is no previous result to fall back on
        self._scenario: Scenario = base
        self._estimate: Estimate = est
        self._valid: dict[str, Any] = base.to_dict()
        self._busy = True  # no observer runs while the traits get their first values
        self._last_exc: ScenarioError | None = None
        # The trace thread writes traits too: every trait write of the widget happens under this lock.
        self._lock = threading.RLock()
        self._trace_job: _TraceJob | None = None
        self._trace_report: dict[str, Any] | None = None
        self._closed = False
        # "Make it fit": the shown recommendation, its key, a small cache and the background worker.
        self._fit_rec: Recommendation | None = None
        self._fit_key_shown: str | None = None  # key of the shown view (None: nothing shown)
        self._fit_key_done: str | None = None  # key last computed, shown or failed: not computed again
        self._fit_cache: OrderedDict[str, Recommendation] = OrderedDict()
        self._fit_thread: threading.Thread | None = None
        self._fit_id = 0
        # Candidate layouts: the shown plan, the scenario it ran for, and the running search.
        self._plan: Plan | None = None
        self._plan_data: tuple[dict[str, Any], float] | None = None
        self._plan_thread: threading.Thread | None = None
        self._plan_id = 0
        self.last_update_ms = 0.0
        headroom = self._check_headroom({"value": headroom})
        super().__init__(
            scenario_data=self._valid,
            options=build_options(self._valid),
            headroom=headroom,
            _vega_js=vega_bundle() if charts_js else "",
            trace={"state": "idle", "progress": {}, "error": "", **self._trace_flags()},
            fit={
                "state": "idle",
                "error": "",
                "id": 0,
                "ms": None,
                "stale": False,
                "rejected": False,
                "view": None,
            },
            layouts={
                "state": "idle",
                "error": "",
                "id": 0,
                "ms": None,
                "gpus": None,
                "stale": False,
                "stale_keys": [],
                "view": None,
            },  # fmt: skip
            **self._derived(est, headroom),
        )
        self.on_msg(self._on_front_msg)
        self._busy = False

    # ----- trait observers ------------------------------------------------------------------------------
    @traitlets.validate("headroom")
    def _check_headroom(self, proposal: Mapping[str, Any]) -> float:
        """Headroom is a share in [0, 0.9]."""
        value = float(proposal["value"])
        if not 0 <= value <= 0.9:
            raise traitlets.TraitError(f"headroom must be between 0 and 0.9, got {value}")
        return value

    @traitlets.observe("headroom")
    def _on_headroom(self, change: Any) -> None:
        """A new headroom changes the verdict and the charts' band."""
        if not self._busy and hasattr(self, "_estimate"):
            with self._lock, self.hold_sync():
                self._refresh()
                self._follow_plan()

    @traitlets.observe("fit_open")
    def _on_fit_open(self, change: Any) -> None:
        """Opening the panel computes the recommendations of the current scenario unless they are shown."""
        if not self._busy and hasattr(self, "_estimate"):
            with self._lock:
                self._follow_plan()

    @traitlets.observe("scenario_data")
    def _on_scenario_data(self, change: Any) -> None:
        """The front end (or Python) wrote a scenario: validate, recompute, or show the error."""
        if self._busy:
            return
        self._submit(change["new"])

    def set_state(self, sync_data: dict[str, Any]) -> None:
        """Front-end writes apply under the widget's lock (the trace thread writes traits too)."""
        with self._lock:
            super().set_state(sync_data)

    # ----- core update ----------------------------------------------------------------------------------
    def _submit(
        self, data: Mapping[str, Any], relative: bool = True, explicit: frozenset[str] = frozenset()
    ) -> ScenarioError | None:
        """Apply a scenario dict; returns the ScenarioError that rejected it (None when it was valid).

        ``relative``: the dict is the previous scenario with some controls moved, so controls the move made
        inapplicable are reset (``normalize``) and an unchanged ``num_gpus`` follows the new layout; ``explicit``
        keys count as changed even when their value stays (``set(parallel={"tp": 1, "sequence_parallel": True})``).
        Omitted keys take their defaults, as in ``Scenario.from_dict``.
        """
        with self._lock:
            return self._apply(data, relative, explicit)

    def _apply(
        self, data: Mapping[str, Any], relative: bool, explicit: frozenset[str]
    ) -> ScenarioError | None:
        """``_submit`` without the lock."""
        t0 = time.perf_counter()
        if not isinstance(data, Mapping):
            exc = ScenarioError("scenario", f"must be a JSON object, got {type(data).__name__}")
            self._reject({}, exc)
            return exc
        data = merge(_defaults(), data)
        if relative:
            changed = changed_keys(self._valid, data) | explicit
            if "num_gpus" not in changed:
                data["num_gpus"] = None  # derived from the layout unless set on purpose
            data = normalize(data, changed)
        self._busy = True
        try:
            try:
                sc = Scenario.from_dict(data)
                est = run_estimate(sc)
            except ScenarioError as exc:
                self._reject(data, exc)
                return exc
            except Exception as exc:  # an engine bug must not freeze the widget silently
                self._reject(data, ScenarioError("scenario", f"internal error {type(exc).__name__}: {exc}"))
                return self._last_exc
            self._scenario, self._estimate, self._valid = sc, est, sc.to_dict()
            self._last_exc = None
            with self.hold_sync():
                self.scenario_data = self._valid
                self.error = ""
                self.error_field = ""
                self.options = build_options(self._valid)
                self._refresh()
                self._set_trace()
                self._follow_plan()
            return None
        finally:
            self._busy = False
            self.last_update_ms = (time.perf_counter() - t0) * 1000

    def _reject(self, data: dict[str, Any], exc: ScenarioError) -> None:
        """Keep the previous result; show the input as typed (completed from the last valid one) and the error."""
        self._last_exc = exc
        shown = merge(self._valid, _known(data))
        if shown.get("num_gpus") is None:
            shown["num_gpus"] = self._valid["num_gpus"]
        with self.hold_sync():
            self.scenario_data = shown
            self.error = str(exc)
            self.error_field = exc.field
            self.options = build_options(shown)
            self._set_trace()
            self._set_fit()

    @staticmethod
    def _derived(est: Estimate, headroom: float) -> dict[str, Any]:
        """``result`` and ``charts`` of an estimate at a headroom."""
        scaling = charts_mod.scaling_data(est, headroom)
        return {
            "result": build_result(est, headroom, scaling),
            "charts": {
                "breakdown": charts_mod.breakdown_spec(est, headroom),
                "scaling": charts_mod.scaling_spec(scaling, headroom, est.gpu.name),
            },
        }

    def _refresh(self) -> None:
        """Recompute result and charts from the current estimate and headroom."""
        for name, value in self._derived(self._estimate, self.headroom).items():
            setattr(self, name, value)

    # ----- verify with trace ------------------------------------------------------------------------------
    def _trace_flags(self, state: str = "idle") -> dict[str, Any]:
        """The parts of ``trace`` that follow the scenario: available/reason, stale/stale_keys, running_stale."""
        if self._last_exc is not None:
            reason = "fix the rejected input first (a trace runs the scenario shown)"
        else:
            exc = trace_check(self._scenario)
            reason = "" if exc is None else str(exc)
        shown = (self._trace_report or {}).get("scenario")
        stale_keys = (
            sorted(changed_keys(shown, self._valid) | changed_keys(self._valid, shown)) if shown else []
        )
        job = self._trace_job
        return {
            "available": not reason,
            "reason": reason,
            "stale": bool(stale_keys),
            "stale_keys": stale_keys,
            "running_stale": state in ("running", "cancelling")
            and job is not None
            and job.data != self._valid,
        }

    def _set_trace(self, **changes: Any) -> None:
        """Update the ``trace`` trait (call under the lock); sends nothing when nothing changed."""
        new = {**self.trace, **changes}
        new.update(self._trace_flags(new.get("state", "idle")))
        if new != self.trace:
            self.trace = new

    def _on_front_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """Messages from the front end: ``verify``, ``cancel`` (trace); ``fit_apply`` (kind, index, id),
        ``layouts`` (gpus) and ``layout_apply`` (candidate, id) for "Make it fit"."""
        if not isinstance(content, Mapping):
            return
        kind = content.get("type")
        if kind == "verify":
            self._start_trace(strict=False)
        elif kind == "cancel":
            self.cancel_verify()
        elif kind == "fit_apply":
            self._fit_apply_msg(content)
        elif kind == "layouts":
            self._start_layouts(content.get("gpus"))
        elif kind == "layout_apply":
            self._layout_apply_msg(content)

    def _start_trace(self, strict: bool) -> _TraceJob | None:
        """Start tracing the current scenario in a thread; the running job if it already traces it.

        ``strict`` (the Python API): raise when the scenario cannot be traced, and cancel a running trace of
        another scenario first. Otherwise (a click) such requests are ignored and return None.
        """
        with self._lock:
            flags = self._trace_flags()
            if not flags["available"]:
                if strict:
                    raise trace_check(self._scenario) or ScenarioError("trace", flags["reason"])
                return None
            previous = self._trace_job
            if previous is not None and previous.running():
                if previous.data == self._valid and not previous.probe.cancel.is_set():
                    return previous
                if not strict:
                    return None
                previous.probe.cancel.set()
            else:
                previous = None
            job = _TraceJob(self._scenario, previous)
            self._trace_job = job
            job.thread = threading.Thread(
                target=self._trace_worker, args=(job,), name="memsim-trace", daemon=True
            )
            self._set_trace(state="running", progress=job.probe.snapshot(), error="")
            job.thread.start()
            return job

    def _publish_progress(self, job: _TraceJob) -> None:
        """Copy the job's progress into ``trace`` while it is the running one."""
        with self._lock:
            if self._trace_job is job and self.trace.get("state") in ("running", "cancelling"):
                self._set_trace(progress=job.probe.snapshot())

    def _trace_worker(self, job: _TraceJob) -> None:
        """The trace thread: wait for a cancelled predecessor, trace, publish the outcome, resolve the future."""
        probe = job.probe
        probe.thread_id = threading.get_ident()
        probe.on_found = lambda: self._publish_progress(job)
        poller = threading.Thread(
            target=self._poll_progress, args=(job,), name="memsim-trace-progress", daemon=True
        )
        poller.start()
        report: dict[str, Any] | None = None
        error: BaseException | None = None
        try:
            if job.previous is not None:
                probe.stage = "stopping the previous trace"
                job.previous.done.wait()
                job.previous = None
            probe.check()
            report = run_trace(job.scenario, probe)
            probe.check()
        except (
            BaseException
        ) as exc:  # anything the trace raises is shown in the widget and kept in the future
            error, report = exc, None
        finally:
            probe.ended = time.monotonic()
        try:
            self._finish_trace(job, report, error)
        finally:
            job.done.set()
            if error is None:
                job.future.set_result(report)  # type: ignore[arg-type]
            else:
                job.future.set_exception(error)
            poller.join()

    def _poll_progress(self, job: _TraceJob) -> None:
        """Publish the job's progress every ``TRACE_POLL_S`` seconds until it is done."""
        while not job.done.wait(TRACE_POLL_S):
            self._publish_progress(job)

    def _finish_trace(
        self, job: _TraceJob, report: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        """Show a finished job's report (or why it stopped) unless a newer job replaced it."""
        with self._lock:
            if self._trace_job is not job:
                return
            progress = {**job.probe.snapshot(), "stage": "finished"}
            if isinstance(error, TraceCancelled) or (error is None and job.probe.cancel.is_set()):
                self._set_trace(state="cancelled", progress=progress, error="")
            elif error is not None:
                text = str(error) if isinstance(error, ScenarioError) else f"{type(error).__name__}: {error}"
                self._set_trace(state="error", progress=progress, error=text)
            else:
                assert report is not None
                with self.hold_sync():
                    self._trace_report = report
                    self.trace_view = build_trace_view(report, seconds=progress["elapsed_s"])
                    self._set_trace(state="done", progress={**progress, "fraction": 1.0}, error="")

    def verify(self, wait: bool = True, timeout: float | None = None) -> Any:
        """Trace the current scenario in the background and show traced vs simulated bytes in the widget.

        ``wait=True`` blocks until the trace is done and returns its report (``memsim_widget.trace.api.
        trace_report``: ``peak_tensor_bytes``, ``components``, ``timeline``, ``top``, ``simulated``, ...), also
        kept as ``trace_report``; ``wait=False`` returns a ``concurrent.futures.Future`` of it. Raises
        ``ScenarioError`` when the scenario cannot be traced here (the reason the button shows), the trace's
        own error if it fails, and ``TraceCancelled`` if it was cancelled. Interrupting the wait cancels it.
        A trace of the same scenario already running is reused; one of another scenario is cancelled first.
        """
        job = self._start_trace(strict=True)
        assert job is not None
        if not wait:
            return job.future
        try:
            return job.future.result(timeout)
        except KeyboardInterrupt:
            self.cancel_verify()
            raise

    def cancel_verify(self) -> bool:
        """Cancel the running trace (it stops at its next module call); False when none is running."""
        with self._lock:
            job = self._trace_job
            if job is None or not job.running() or job.probe.cancel.is_set():
                return False
            job.probe.cancel.set()
            self._set_trace(state="cancelling", progress=job.probe.snapshot())
            return True

    @property
    def trace_report(self) -> dict[str, Any] | None:
        """The report of the last finished trace (None before the first); ``trace["stale"]`` says if it is
        of another scenario than the current one."""
        return self._trace_report

    # ----- make it fit: recommendations -------------------------------------------------------------------
    def _fit_key(self) -> str:
        """What a recommendation depends on, as a cache key: the last valid scenario and the headroom."""
        return json.dumps([self._valid, self.headroom], sort_keys=True)

    def _set_fit(self, **changes: Any) -> None:
        """Update the ``fit`` trait (under the lock) with ``stale``/``rejected`` recomputed; sends nothing when
        nothing changed (the ordinary update path calls it on every change)."""
        new = {**self.fit, **changes}
        new["stale"] = self._fit_key_shown is not None and self._fit_key_shown != self._fit_key()
        new["rejected"] = self._last_exc is not None
        if new != self.fit:
            self.fit = new

    def _follow_plan(self) -> None:
        """After a change (under the lock): refresh both panels' stale flags; recompute recommendations if open."""
        self._set_fit()
        self._set_layouts()
        if self.fit_open and not self._closed:
            self._schedule_fit()

    def _cache_fit(self, key: str, rec: Recommendation) -> None:
        """Keep a recommendation for ``key``, dropping the least recently used beyond ``FIT_CACHE``."""
        self._fit_cache[key] = rec
        self._fit_cache.move_to_end(key)
        while len(self._fit_cache) > FIT_CACHE:
            self._fit_cache.popitem(last=False)

    def _publish_fit(self, key: str, rec: Recommendation, ms: float) -> None:
        """Show a recommendation (under the lock); a failure to lay it out shows as the panel's error."""
        self._fit_id += 1
        try:
            view = build_fit_view(rec)
        except Exception as exc:  # a bug in the view must not break the widget: shown in place
            self._fit_rec, self._fit_key_shown, self._fit_key_done = None, None, key
            self._set_fit(state="error", error=_error_text(exc), id=self._fit_id, view=None)
            return
        self._fit_rec, self._fit_key_shown, self._fit_key_done = rec, key, key
        self._set_fit(state="done", error="", id=self._fit_id, ms=round(ms, 1), view=view)

    def _schedule_fit(self) -> None:
        """Show the current scenario's recommendations (under the lock): at once from the cache, else from the
        background worker, which is started unless it runs (it always finishes on the newest scenario)."""
        key = self._fit_key()
        if key == self._fit_key_done:
            return
        rec = self._fit_cache.get(key)
        if rec is not None:
            self._fit_cache.move_to_end(key)
            self._publish_fit(key, rec, 0.0)
            return
        self._fit_key_done = None  # whatever was computed last, the current scenario's is not
        self._set_fit(state="running", error="")
        if self._fit_thread is None:
            self._fit_thread = threading.Thread(target=self._fit_worker, name="memsim-recommend", daemon=True)
            self._fit_thread.start()

    def _fit_worker(self) -> None:
        """Background thread: compute recommendations until the newest scenario's are shown or the panel closes."""
        while True:
            with self._lock:
                key = self._fit_key()
                if self._closed or not self.fit_open or key == self._fit_key_done:
                    self._fit_thread = None
                    if self.fit.get("state") == "running" and key != self._fit_key_done and not self._closed:
                        self._set_fit(state="idle")  # closed before the newest was computed
                    return
                sc, headroom = self._scenario, self.headroom
            t0 = time.perf_counter()
            rec: Recommendation | None = None
            error: Exception | None = None
            try:
                rec = plan_recommend(sc, headroom=headroom)
            except Exception as exc:  # shown in the panel; the widget keeps working
                error = exc
            ms = (time.perf_counter() - t0) * 1000
            with self._lock:
                if rec is not None:
                    self._cache_fit(key, rec)
                if self._closed or key != self._fit_key():
                    continue  # the scenario moved on meanwhile: the next round computes the newest
                if rec is not None:
                    self._publish_fit(key, rec, ms)
                else:
                    self._fit_id += 1
                    self._fit_rec, self._fit_key_shown, self._fit_key_done = None, None, key
                    self._set_fit(state="error", error=_error_text(error), id=self._fit_id, view=None)

    def _fit_apply_msg(self, content: Mapping[str, Any]) -> None:
        """ "Apply" in the panel: set the scenario of the named entry of the shown (current) recommendation."""
        with self._lock:
            rec = self._fit_rec
            if rec is None or content.get("id") != self.fit.get("id") or self.fit.get("stale"):
                self._set_fit(error="the recommendations changed since: pick again")
                return
            try:
                target = fit_target(rec, str(content.get("kind", "change")), content.get("index"))  # type: ignore[arg-type]
            except ScenarioError as exc:
                self._set_fit(error=str(exc))
                return
            exc = self._submit(target.to_dict(), relative=False)
            if exc is not None:
                self._set_fit(error=f"could not apply it: {exc}")

    def recommend(self) -> Recommendation:
        """What makes the current scenario fit at the widget's headroom (``memsim_widget.plan.recommend``).

        Blocks (10-150 ms; cached per scenario and headroom) and shows the result in the "Make it fit" panel
        too. ``.changes`` are the smallest fixing changes, ``.singles`` each lever alone, ``.max_micro_batch``,
        ``.max_seq_len`` and ``.min_gpus`` how far the scenario goes. Raises what ``recommend`` raises.
        """
        with self._lock:
            key, sc, headroom = self._fit_key(), self._scenario, self.headroom
            rec = self._fit_cache.get(key)
        ms = 0.0
        if rec is None:
            t0 = time.perf_counter()
            rec = plan_recommend(sc, headroom=headroom)
            ms = (time.perf_counter() - t0) * 1000
        with self._lock:
            self._cache_fit(key, rec)
            if key == self._fit_key() and key != self._fit_key_shown:
                self._publish_fit(key, rec, ms)
        return rec

    def apply_recommendation(self, index: int = 0, kind: str = "change") -> MemSim:
        """Apply entry ``index`` of ``recommend()`` as an edit would (controls, verdict and charts follow).

        ``kind``: ``change`` (a fixing change, 0 = the recommended one), ``lever`` (a single lever),
        ``max_micro_batch``, ``max_seq_len`` or ``min_gpus``. Raises ``ScenarioError`` when there is no such
        entry (e.g. no change fits).
        """
        self.scenario = fit_target(self.recommend(), kind, index)
        return self

    # ----- make it fit: candidate layouts ------------------------------------------------------------------
    def _set_layouts(self, **changes: Any) -> None:
        """Update the ``layouts`` trait (under the lock) with ``stale``/``stale_keys`` recomputed."""
        new = {**self.layouts, **changes}
        keys: list[str] = []
        if self._plan_data is not None:
            data, headroom = self._plan_data
            keys = layouts_stale_keys(data, self._valid) + (["headroom"] if headroom != self.headroom else [])
        new["stale_keys"], new["stale"] = keys, bool(keys)
        if new != self.layouts:
            self.layouts = new

    def _run_plan(
        self, sc: Scenario, headroom: float, gpus: Any, kwargs: Mapping[str, Any]
    ) -> tuple[Plan, dict[str, Any], float]:
        """Run the layout search for ``sc`` (outside the lock) and lay it out: the plan, its view, milliseconds."""
        t0 = time.perf_counter()
        p = plan_search(
            base=sc, gpus=sc.parallel.world_size if gpus is None else gpus, headroom=headroom, **kwargs
        )
        view = build_layouts_view(p)
        return p, view, (time.perf_counter() - t0) * 1000

    def _publish_layouts(
        self, data: dict[str, Any], headroom: float, p: Plan, view: dict[str, Any], ms: float
    ) -> None:
        """Show a finished layout search (under the lock)."""
        self._plan, self._plan_data = p, (data, headroom)
        self._plan_id += 1
        self._set_layouts(
            state="done", error="", id=self._plan_id, ms=round(ms, 1), gpus=list(p.gpu_counts), view=view
        )

    def _start_layouts(self, gpus: Any = None) -> None:
        """The "Search layouts" button: search in a background thread (ignored while one runs)."""
        with self._lock:
            if self._plan_thread is not None or self._closed:
                return
            if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
                self._set_layouts(state="error", error=f"GPUs: must be a positive whole number, got {gpus!r}")
                return
            args = (self._scenario, self._valid, self.headroom, gpus)
            self._set_layouts(state="running", error="")
            self._plan_thread = threading.Thread(
                target=self._layouts_worker, args=args, name="memsim-layouts", daemon=True
            )
            self._plan_thread.start()

    def _layouts_worker(self, sc: Scenario, data: dict[str, Any], headroom: float, gpus: int | None) -> None:
        """Background thread of one layout search: run it and show the result or its error."""
        result: tuple[Plan, dict[str, Any], float] | None = None
        error: Exception | None = None
        try:
            result = self._run_plan(sc, headroom, gpus, {})
        except Exception as exc:  # shown in the panel; the widget keeps working
            error = exc
        with self._lock:
            self._plan_thread = None
            if self._closed:
                return
            if result is None:
                self._set_layouts(state="error", error=_error_text(error))
            else:
                self._publish_layouts(data, headroom, *result)

    def _layout_apply_msg(self, content: Mapping[str, Any]) -> None:
        """ "Apply" on a candidate layout: set that candidate's scenario (of the shown, current search)."""
        with self._lock:
            p = self._plan
            cand = content.get("candidate")
            if p is None or content.get("id") != self.layouts.get("id") or self.layouts.get("stale"):
                self._set_layouts(error="the search is of another scenario: search again")
                return
            if isinstance(cand, bool) or not isinstance(cand, int) or not 0 <= cand < p.evaluated:
                self._set_layouts(error=f"no candidate {cand!r}")
                return
            exc = self._submit(p.scenario(cand).to_dict(), relative=False)
            self._set_layouts(error=f"could not apply it: {exc}" if exc is not None else "")

    def plan_layouts(self, gpus: int | tuple[int, int] | list[int] | None = None, **kwargs: Any) -> Plan:
        """Search layouts and memory knobs for the current model and GPU type (``memsim_widget.plan.plan``).

        ``gpus``: a count, list or ``(low, high)`` range (default: the scenario's GPU count). ``kwargs`` go to
        ``plan`` (``global_batch_tokens``, ``space``, ``top``). Blocks (0.1-0.5 s typically), shows the best
        candidates and the candidates chart in the panel, and returns the ``Plan`` (``.frame``, ``.summary()``).
        """
        with self._lock:
            sc, data, headroom = self._scenario, self._valid, self.headroom
        result = self._run_plan(sc, headroom, gpus, kwargs)
        with self._lock:
            self._publish_layouts(data, headroom, *result)
        return result[0]

    def apply_layout(self, rank: int = 0) -> MemSim:
        """Apply the ``rank``-th best candidate (0 = best) of the last layout search as an edit would.

        Searches first (same GPU counts as last time) when there was no search or it is stale. Raises
        ``ScenarioError`` when no candidate has that rank (e.g. nothing fits).
        """
        with self._lock:
            p, stale, gpus = self._plan, self.layouts.get("stale"), self.layouts.get("gpus")
        if p is None or stale:
            p = self.plan_layouts(gpus)
        frame = p.frame
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(frame):
            raise ScenarioError("layout", f"no candidate ranked {rank!r} ({p.fitting} fit)")
        self.scenario = p.scenario(int(frame.candidate.iloc[rank]))
        return self

    def close(self) -> None:
        """Close the widget (a running trace is cancelled)."""
        if "_lock" in self.__dict__:
            self.cancel_verify()
            self._closed = True
        super().close()

    # ----- Python API -----------------------------------------------------------------------------------
    @property
    def scenario(self) -> Scenario:
        """The last valid scenario."""
        return self._scenario

    @scenario.setter
    def scenario(self, value: Scenario | Mapping[str, Any]) -> None:
        """Replace the whole scenario (raises ScenarioError if it is invalid; the widget shows it too)."""
        data = value.to_dict() if isinstance(value, Scenario) else dict(value)
        exc = self._submit(data, relative=False)
        if exc is not None:
            raise exc

    @property
    def estimate(self) -> Estimate:
        """The estimate of the last valid scenario."""
        return self._estimate

    @property
    def frame(self) -> Any:
        """The breakdown as a pandas DataFrame (rank, stage, moment, category, item, bytes, gib, counter, formula)."""
        return self._estimate.frame

    def set(self, **changes: Any) -> MemSim:
        """Change scenario keys like the controls do (``parallel``/``lora`` accept partial dicts); raises if invalid."""
        exc = self._submit(merge(self.scenario_data, changes), explicit=frozenset(flatten(changes)))
        if exc is not None:
            raise exc
        return self

    def chart(self) -> Any:
        """The breakdown chart (Altair): stacked categories per rank, capacity line and headroom band."""
        return charts_mod.breakdown_chart(self._estimate, self.headroom)

    def scaling_chart(self) -> Any:
        """The "how it scales" chart (Altair): memory against micro-batch and sequence length."""
        return charts_mod.scaling_chart(self._estimate, self.headroom)

    def save_chart(self, path: str | Path, which: str = "breakdown", scale_factor: float = 2.0) -> Path:
        """Save a chart (``breakdown`` or ``scaling``) as .png, .svg, .pdf, .html or .json (vl-convert)."""
        charts = {"breakdown": self.chart, "scaling": self.scaling_chart}
        if which not in charts:
            raise ValueError(f"which must be one of {', '.join(charts)}, got {which!r}")
        path = Path(path)
        kwargs = {"scale_factor": scale_factor} if path.suffix.lower() == ".png" else {}
        charts[which]().save(str(path), **kwargs)
        return path

    def to_json(self, indent: int | None = 2) -> str:
        """The last valid scenario as JSON (``MemSim.from_json`` reads it back)."""
        return self._scenario.to_json(indent=indent)

    @classmethod
    def from_json(cls, text_or_path: str | Path, **kwargs: Any) -> MemSim:
        """A widget for a scenario JSON file or text."""
        return cls(Scenario.from_json(text_or_path), **kwargs)

    def __repr__(self) -> str:
        """Deterministic one-liner: model, GPU, verdict, peak and its moment (no memory address)."""
        est = self._estimate
        text = (
            f"MemSim({charts_mod.model_label(self._scenario.model)} on "
            f"{charts_mod.gpu_label(self._scenario.gpu)}: {est.verdict(self.headroom)}, "
            f"peak {est.device_total_bytes / GiB:.1f} GiB at {est.peak_phase}"
        )
        if self.error:
            text += f"; rejected {self.error_field or 'input'}"
        return text + ")"
