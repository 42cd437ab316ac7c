"""The "Make it fit" panel's recommendations: their view, the scenario "Apply" sets, and the ``MemSim`` methods.

They are computed in a background thread only while the panel is open (``fit_open``; on every change then,
cached per scenario and headroom), so the ordinary update stays fast; ``MemSim.recommend`` computes them on
request. Applying one replaces the scenario through ``_submit``, the path of every edit.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memsim_widget.engine.items import fmt_bytes
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.widget.result import GiB

if TYPE_CHECKING:  # the planner (and numpy) load on first use of "Make it fit", not with the widget
    from memsim_widget.plan import Change, Recommendation
    from memsim_widget.widget.memsim import MemSim

#: Recommendations kept per widget (scenario and headroom -> ``Recommendation``), so moving a control back
#: and forth with the panel open does not compute them again.
FIT_CACHE = 16
#: What "Apply" can apply from a recommendation (``MemSim.apply_recommendation``'s ``kind``).
FIT_KINDS = ("change", "lever", "max_micro_batch", "max_seq_len", "min_gpus")


def _error_text(exc: BaseException | None) -> str:
    """An exception as the panels show it: a ScenarioError's own text, else its type and message."""
    return str(exc) if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"


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


class FitPanel:
    """``MemSim``'s recommendation methods (a mixin: the traits, ``_lock`` and the scenario are MemSim's).

    Tests replace ``plan_recommend`` in this module, where the methods look it up.
    """

    def _init_fit(self) -> None:
        """The recommendation state of a new widget: the shown one, its key, a small cache, the worker."""
        self._fit_rec: Recommendation | None = None
        self._fit_key_shown: str | None = None  # key of the shown view (None: nothing shown)
        self._fit_key_done: str | None = None  # key last computed, shown or failed: not computed again
        self._fit_cache: OrderedDict[str, Recommendation] = OrderedDict()
        self._fit_thread: threading.Thread | None = None
        self._fit_id = 0

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
