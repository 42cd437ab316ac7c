"""The "Make it fit" panel's candidate layouts: the view of a layout search and the panel's controller.

A search (``memsim_widget.plan.plan``) runs on request: the "Search layouts" button (a background thread) or
``MemSim.plan_layouts``. Applying a candidate replaces the scenario through ``_submit``, the path of every edit.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from memsim_widget import charts as charts_mod
from memsim_widget.catalog.gpus import resolve_gpu
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.widget.background import BackgroundJob, JobSlot, error_text
from memsim_widget.widget.scenario_edits import changed_keys

if TYPE_CHECKING:  # the planner (and numpy) load on first search, not with the widget
    from memsim_widget.plan import Plan
    from memsim_widget.widget.host import WidgetHost

#: Candidate layouts listed with an "Apply" button, and points the candidates chart draws at most.
LAYOUT_ROWS = 5
LAYOUT_POINTS = 600
#: Scenario keys the layout search chooses itself: changing them does not make a search result stale.
LAYOUT_SEARCHED = frozenset(
    {"micro_batch_size", "grad_accum_steps", "activation_checkpointing", "loss", "optimizer", "optimizer_impl",
     "num_gpus", "parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep", "parallel.zero",
     "parallel.sequence_parallel", "parallel.pp_microbatches", "parallel.offload"}
)  # fmt: skip

#: Keys of a candidate row and where the scenario keeps them: the row the scenario uses is marked ``current``.
LAYOUT_KEYS = (
    ("dp", "parallel.dp"), ("tp", "parallel.tp"), ("pp", "parallel.pp"), ("cp", "parallel.cp"),
    ("ep", "parallel.ep"), ("zero", "parallel.zero"), ("sequence_parallel", "parallel.sequence_parallel"),
    ("offload", "parallel.offload"), ("micro_batch_size", "micro_batch_size"),
    ("grad_accum_steps", "grad_accum_steps"), ("activation_checkpointing", "activation_checkpointing"),
    ("loss", "loss"), ("optimizer", "optimizer"),
)  # fmt: skip
_MISSING = object()


def _at(data: Any, path: str) -> Any:
    """The value at a dotted key of a scenario dict, ``_MISSING`` when absent."""
    for part in path.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return _MISSING
        data = data[part]
    return data


def layout_is_current(row: Mapping[str, Any], data: Mapping[str, Any]) -> bool:
    """True when the scenario dict ``data`` already uses a candidate row (every searched key equal; a bool
    equals only a bool, as in JSON)."""
    for key, path in LAYOUT_KEYS:
        value = _at(data, path)
        if value != row.get(key) or isinstance(value, bool) != isinstance(row.get(key), bool):
            return False
    return True


def mark_current(view: Mapping[str, Any] | None, data: Mapping[str, Any]) -> Any:
    """The layouts ``view`` with each top row's ``current`` flag set for ``data`` (the same object when no flag
    changes, so an unchanged trait is not sent again)."""
    if not view:
        return view
    top = view.get("top") or []
    flags = [layout_is_current(r, data) for r in top]
    if all(r.get("current") is f for r, f in zip(top, flags, strict=True)):
        return view
    return {**view, "top": [{**r, "current": f} for r, f in zip(top, flags, strict=True)]}


def plan_search(**kwargs: Any) -> Plan:
    """``memsim_widget.plan.plan``, imported on first use (tests replace this function)."""
    from memsim_widget.plan import plan

    return plan(**kwargs)


def build_layouts_view(p: Plan, rows: int = LAYOUT_ROWS, points: int = LAYOUT_POINTS) -> dict[str, Any]:
    """The ``view`` of the ``layouts`` trait: the search in numbers, the best ``rows`` candidates, the chart."""
    from memsim_widget.charts.plan import candidates_spec

    top = []
    # itertuples yields namedtuples (pandas' stubs say plain tuples): the columns are read as attributes
    named_rows = cast("Iterable[Any]", p.frame.head(rows).itertuples(index=False))
    for rank, r in enumerate(named_rows, start=1):
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
                "exports": p.export_answers(int(r.candidate)),
            }
        )
    return {
        "gpu_counts": list(p.gpu_counts),
        "evaluated": p.evaluated,
        "fitting": p.fitting,
        "seconds": round(p.seconds, 4),
        "summary": p.summary(),
        "widened": p.widened_text(),
        "model": charts_mod.model_label(p.base.model),
        "gpu": resolve_gpu(p.base.gpu).name,
        "top": top,
        "chart": candidates_spec(p, limit=points),
    }


def layouts_stale_keys(shown: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Keys that differ between the scenario a layout search ran for and ``current``, except the searched ones."""
    keys = changed_keys(shown, current) | changed_keys(current, shown)
    return sorted(k for k in keys if k not in LAYOUT_SEARCHED)


#: A finished search: the plan, its view and the milliseconds it took.
_Searched = tuple["Plan", dict[str, Any], float]


class LayoutsController:
    """The candidate layouts of "Make it fit" for a widget (its ``WidgetHost``): the shown plan, the search job.

    ``MemSim.plan_layouts`` and ``apply_layout`` delegate here. Tests replace ``plan_search`` in this module,
    where the controller looks it up.
    """

    def __init__(self, host: WidgetHost) -> None:
        """The layout state of a new widget: no plan shown, no search running."""
        self.host = host
        self.plan: Plan | None = None  # the shown one
        self.plan_for: tuple[dict[str, Any], float] | None = None  # its scenario dict and headroom
        self.jobs: JobSlot[_Searched] = JobSlot(host._lock, "memsim-layouts")
        self.id = 0

    @staticmethod
    def initial() -> dict[str, Any]:
        """The ``layouts`` trait of a new widget."""
        return {
            "state": "idle", "error": "", "id": 0, "ms": None, "gpus": None, "stale": False, "stale_keys": [],
            "view": None,
        }  # fmt: skip

    def update(self, **changes: Any) -> None:
        """Update the ``layouts`` trait (under the lock) with ``stale``/``stale_keys`` and the rows' ``current``
        flags (against the scenario shown, valid or not) recomputed."""
        host = self.host
        new = {**host._trait("layouts"), **changes}
        keys: list[str] = []
        if self.plan_for is not None:
            data, headroom = self.plan_for
            keys = layouts_stale_keys(data, host._valid) + (["headroom"] if headroom != host.headroom else [])
        new["stale_keys"], new["stale"] = keys, bool(keys)
        new["view"] = mark_current(new.get("view"), host.scenario_data)
        host._publish("layouts", new)

    @staticmethod
    def _search(sc: Scenario, headroom: float, gpus: Any, kwargs: Mapping[str, Any]) -> _Searched:
        """Run the layout search for ``sc`` (outside the lock) and lay it out: the plan, its view, milliseconds."""
        t0 = time.perf_counter()
        p = plan_search(
            base=sc, gpus=sc.parallel.world_size if gpus is None else gpus, headroom=headroom, **kwargs
        )
        view = build_layouts_view(p)
        return p, view, (time.perf_counter() - t0) * 1000

    def _show(self, data: dict[str, Any], headroom: float, p: Plan, view: dict[str, Any], ms: float) -> None:
        """Show a finished layout search (under the lock)."""
        self.plan, self.plan_for = p, (data, headroom)
        self.id += 1
        self.update(state="done", error="", id=self.id, ms=round(ms, 1), gpus=list(p.gpu_counts), view=view)

    def search_msg(self, content: Mapping[str, Any]) -> None:
        """The "Search layouts" button (``gpus``: the GPU count, the scenario's when absent)."""
        self.start(content.get("gpus"))

    def start(self, gpus: Any = None) -> None:
        """Search layouts in a background job (ignored while one runs)."""
        host = self.host
        with host._lock:
            if self.jobs.running or host._closed:
                return
            if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
                self.update(state="error", error=f"GPUs: must be a positive whole number, got {gpus!r}")
                return
            sc, data, headroom = host.scenario, host._valid, host.headroom
            self.update(state="running", error="")
            self.jobs.start(
                lambda _job: self._search(sc, headroom, gpus, {}), self._finish, subject=(data, headroom)
            )

    def _finish(
        self, job: BackgroundJob[_Searched], result: _Searched | None, error: BaseException | None
    ) -> None:
        """Show the search's result or its error (under the lock)."""
        if self.host._closed:
            return
        if result is None:
            self.update(state="error", error=error_text(error))
        else:
            data, headroom = job.subject
            self._show(data, headroom, *result)

    def apply_msg(self, content: Mapping[str, Any]) -> None:
        """ "Apply" on a candidate layout: set that candidate's scenario (of the shown, current search)."""
        host = self.host
        with host._lock:
            p, layouts = self.plan, host._trait("layouts")
            cand = content.get("candidate")
            if p is None or content.get("id") != layouts.get("id") or layouts.get("stale"):
                self.update(error="the search is of another scenario: search again")
                return
            if isinstance(cand, bool) or not isinstance(cand, int) or not 0 <= cand < p.evaluated:
                self.update(error=f"no candidate {cand!r}")
                return
            exc = host._submit(p.scenario(cand).to_dict(), relative=False, defer_scaling=True)
            self.update(error=f"could not apply it: {exc}" if exc is not None else "")

    def search(self, gpus: int | tuple[int, int] | list[int] | None, kwargs: Mapping[str, Any]) -> Plan:
        """``MemSim.plan_layouts``: search now (blocking), show the result and return the plan."""
        host = self.host
        with host._lock:
            sc, data, headroom = host.scenario, host._valid, host.headroom
        result = self._search(sc, headroom, gpus, kwargs)
        with host._lock:
            self._show(data, headroom, *result)
        return result[0]

    def candidate(self, rank: int) -> Scenario:
        """``MemSim.apply_layout``'s scenario: the ``rank``-th best candidate, searched again first when stale."""
        with self.host._lock:
            p, layouts = self.plan, self.host._trait("layouts")
            stale, gpus = layouts.get("stale"), layouts.get("gpus")
        if p is None or stale:
            p = self.search(gpus, {})
        frame = p.frame
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(frame):
            raise ScenarioError("layout", f"no candidate ranked {rank!r} ({p.fitting} fit)")
        return p.scenario(int(frame.candidate.iloc[rank]))
