"""The "Make it fit" panel's recommendations: their view, the scenario "Apply" sets, and the panel's controller.

They are computed in a background thread only while the panel is open (``fit_open``; on every change then,
cached per scenario and headroom), so the ordinary update stays fast; ``MemSim.recommend`` computes them on
request. Applying one replaces the scenario through ``_submit``, the path of every edit.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.units import GiB, fmt_bytes
from memsim_widget.widget.background import BackgroundJob, JobSlot, error_text

if TYPE_CHECKING:  # the planner (and numpy) load on first use of "Make it fit", not with the widget
    from memsim_widget.plan import Change, Recommendation
    from memsim_widget.widget.host import WidgetHost

#: Recommendations kept per widget (scenario and headroom -> ``Recommendation``), so moving a control back
#: and forth with the panel open does not compute them again.
FIT_CACHE = 16
#: What "Apply" can apply from a recommendation (``MemSim.apply_recommendation``'s ``kind``).
FIT_KINDS = ("change", "lever", "max_micro_batch", "max_seq_len", "min_gpus", "max_micro_batch_searched",
             "max_seq_len_searched", "min_gpus_searched")  # fmt: skip


def plan_recommend(scenario: Scenario, headroom: float) -> Recommendation:
    """``memsim_widget.plan.recommend``, imported on first use (tests replace this function)."""
    from memsim_widget.plan import recommend

    return recommend(scenario, headroom=headroom)


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


def _reach_view(rec: Recommendation, kind: str) -> dict[str, Any] | None:
    """A largest micro-batch / sequence on the same GPUs, or the fewest GPUs, with any layout and knobs
    (``plan.reach``), without its scenario."""
    r = getattr(rec, kind)
    if r is None:
        return None
    out = {k: v for k, v in r.to_dict().items() if k != "scenario"}
    out["device_total"] = fmt_bytes(r.estimate.device_total_bytes)
    return out


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
        else {k: mg[k] for k in ("num_gpus", "dp", "tp", "pp", "zero", "device_total_bytes") if k in mg},
        "max_micro_batch_searched": _reach_view(rec, "max_micro_batch_searched"),
        "max_seq_len_searched": _reach_view(rec, "max_seq_len_searched"),
        "min_gpus_searched": _reach_view(rec, "min_gpus_searched"),
        "with_first_fix": rec.with_first_fix,
        "bound": rec.bound,
        "smallest_card": rec.smallest_card,
        "summary": rec.summary(),
    }


def fit_target(rec: Recommendation, kind: str = "change", index: int = 0) -> Scenario:
    """The scenario "Apply" sets for one entry of a recommendation (``kind`` one of ``FIT_KINDS``).

    ``change``/``lever``: the ``index``-th fixing change / single lever; ``max_micro_batch``, ``max_seq_len``:
    the scenario with the largest micro-batch / sequence that fits; ``min_gpus``: the fewest GPUs that fit with
    the scenario's knobs; ``max_micro_batch_searched``/``max_seq_len_searched``: the cheapest layout of the same
    GPUs that reaches the largest micro-batch / sequence; ``min_gpus_searched``: the cheapest candidate on the
    fewest GPUs with any layout and knobs (its knobs and global batch as the planner set them).
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
    if kind in ("max_micro_batch_searched", "max_seq_len_searched", "min_gpus_searched"):
        r = getattr(rec, kind)
        if r is None:
            where = "any number of GPUs searched" if kind == "min_gpus_searched" else "these GPUs"
            raise missing(f"no layout of {where} fits ({kind})")
        return r.scenario
    raise missing(f"kind must be one of {', '.join(FIT_KINDS)}, got {kind!r}")


class FitController:
    """The recommendations part of "Make it fit" for a widget (its ``WidgetHost``): shown one, cache, worker.

    ``MemSim.recommend`` and ``apply_recommendation`` delegate here. Tests replace ``plan_recommend`` in this
    module, where the controller looks it up.
    """

    def __init__(self, host: WidgetHost) -> None:
        """The recommendation state of a new widget: nothing shown, an empty cache, no job."""
        self.host = host
        self.rec: Recommendation | None = None  # the shown one
        self.key_shown: str | None = None  # key of the shown view (None: nothing shown)
        self.key_done: str | None = None  # key last computed, shown or failed: not computed again
        self.cache: OrderedDict[str, Recommendation] = OrderedDict()
        self.jobs: JobSlot[tuple[Recommendation, float]] = JobSlot(host._lock, "memsim-recommend")
        self.id = 0

    @staticmethod
    def initial() -> dict[str, Any]:
        """The ``fit`` trait of a new widget."""
        return {
            "state": "idle",
            "error": "",
            "id": 0,
            "ms": None,
            "stale": False,
            "rejected": False,
            "view": None,
        }

    def key(self) -> str:
        """What a recommendation depends on, as a cache key: the last valid scenario and the headroom."""
        return json.dumps([self.host._valid, self.host.headroom], sort_keys=True)

    def update(self, **changes: Any) -> None:
        """Update the ``fit`` trait (under the lock) with ``stale``/``rejected`` recomputed; sends nothing when
        nothing changed (the ordinary update path calls it on every change)."""
        new = {**self.host._trait("fit"), **changes}
        new["stale"] = self.key_shown is not None and self.key_shown != self.key()
        new["rejected"] = self.host._last_exc is not None
        self.host._publish("fit", new)

    def _remember(self, key: str, rec: Recommendation) -> None:
        """Keep a recommendation for ``key``, dropping the least recently used beyond ``FIT_CACHE``."""
        self.cache[key] = rec
        self.cache.move_to_end(key)
        while len(self.cache) > FIT_CACHE:
            self.cache.popitem(last=False)

    def _show(
        self, key: str, rec: Recommendation | None, ms: float, error: BaseException | None = None
    ) -> None:
        """Show a recommendation, or the error that stopped it (under the lock); a failure to lay it out shows
        as the panel's error too."""
        self.id += 1
        view = None
        if rec is not None:
            try:
                view = build_fit_view(rec)
            except Exception as exc:  # a bug in the view must not break the widget: shown in place
                error = exc
        if view is None:
            self.rec, self.key_shown, self.key_done = None, None, key
            self.update(state="error", error=error_text(error), id=self.id, view=None)
            return
        self.rec, self.key_shown, self.key_done = rec, key, key
        self.update(state="done", error="", id=self.id, ms=round(ms, 1), view=view)

    def schedule(self) -> None:
        """Show the current scenario's recommendations (under the lock): at once from the cache, else from a
        background job, started unless one runs (its ``finish`` starts the next for a newer scenario)."""
        key = self.key()
        if key == self.key_done:
            return
        rec = self.cache.get(key)
        if rec is not None:
            self.cache.move_to_end(key)
            self._show(key, rec, 0.0)
            return
        self.key_done = None  # whatever was computed last, the current scenario's is not
        self.update(state="running", error="")
        if not self.jobs.running:
            self._start(key)

    def _start(self, key: str) -> None:
        """Compute the recommendation of the current scenario (``key``) in the background (under the lock)."""
        sc, headroom = self.host.scenario, self.host.headroom
        self.jobs.start(lambda _job: self._compute(sc, headroom), self._finish, subject=key)

    @staticmethod
    def _compute(sc: Scenario, headroom: float) -> tuple[Recommendation, float]:
        """A recommendation and the milliseconds it took (outside the lock)."""
        t0 = time.perf_counter()
        rec = plan_recommend(sc, headroom=headroom)
        return rec, (time.perf_counter() - t0) * 1000

    def _finish(
        self,
        job: BackgroundJob[tuple[Recommendation, float]],
        result: tuple[Recommendation, float] | None,
        error: BaseException | None,
    ) -> None:
        """Cache and show a finished job's recommendation (under the lock); when the scenario moved on meanwhile,
        compute the newest while the panel is open."""
        key = job.subject
        if result is not None:
            self._remember(key, result[0])
        host = self.host
        if host._closed:
            return
        if key == self.key():
            self._show(key, *(result or (None, 0.0)), error=error)
            return
        if host._trait("fit_open") and self.key() != self.key_done:
            self._start(self.key())
        elif host._trait("fit").get("state") == "running" and self.key() != self.key_done:
            self.update(state="idle")  # closed before the newest was computed

    def apply_msg(self, content: Mapping[str, Any]) -> None:
        """ "Apply" in the panel: set the scenario of the named entry of the shown (current) recommendation."""
        host = self.host
        with host._lock:
            rec, fit = self.rec, host._trait("fit")
            if rec is None or content.get("id") != fit.get("id") or fit.get("stale"):
                self.update(error="the recommendations changed since: pick again")
                return
            try:
                target = fit_target(rec, str(content.get("kind", "change")), content.get("index"))  # type: ignore[arg-type]
            except ScenarioError as exc:
                self.update(error=str(exc))
                return
            exc = host._submit(target.to_dict(), relative=False, defer_scaling=True)
            if exc is not None:
                self.update(error=f"could not apply it: {exc}")

    def recommend(self) -> Recommendation:
        """``MemSim.recommend``: the current scenario's recommendation (cached), shown in the panel too."""
        host = self.host
        with host._lock:
            key, sc, headroom = self.key(), host.scenario, host.headroom
            rec = self.cache.get(key)
        ms = 0.0
        if rec is None:
            rec, ms = self._compute(sc, headroom)
        with host._lock:
            self._remember(key, rec)
            if key == self.key() and key != self.key_shown:
                self._show(key, rec, ms)
        return rec
