"""Background work of the widget's panels: "Verify with trace", "Make it fit"'s recommendations and its layouts,
a calibrated model's first estimate and the "how it scales" view of a front-end edit.

Each of them runs the same way: a daemon thread does the slow part outside the widget's lock, then publishes
its outcome under the lock, unless a newer job of the same panel superseded it. A ``BackgroundJob`` is one such
run (its thread, cancel flag, ``done`` event and the ``Future`` of its result); a ``JobSlot`` is a panel's
current job. What a job computes for (its ``subject``: a scenario dict, a cache key) tells the panel whether
the outcome is stale, the scenario having moved on meanwhile.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from memsim_widget.errors import ScenarioError

T = TypeVar("T")

#: How long the interpreter's exit waits, in all, for running jobs after cancelling them (``stop_all``).
EXIT_JOIN_S = 5.0
#: The jobs whose thread was started and has not ended (``stop_all`` cancels and joins them at exit).
_LIVE: weakref.WeakSet[BackgroundJob[Any]] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()

#: ``finish(job, result, error)``: publish a job's outcome (called under the widget's lock, current jobs only).
Finish = Callable[["BackgroundJob[T]", "T | None", "BaseException | None"], None]


def error_text(exc: BaseException | None) -> str:
    """An exception as the panels show it: a ScenarioError's own text, else its type and message."""
    return str(exc) if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"


class BackgroundJob(Generic[T]):
    """One run of a panel's slow work in a daemon thread (``JobSlot.start`` makes and starts it).

    ``work(job)`` runs outside the lock and may stop early when ``cancelled`` (the trace's probe shares its
    ``cancel_event``). Then, under the lock, the job stops counting as ``running`` and its slot's ``finish``
    publishes the outcome if the job is still the slot's current one; ``done`` is set after that, and the
    ``future`` holds the result (or the exception ``work`` raised). While it runs, ``tick(job)`` (if given) is
    called every ``every`` seconds from a second thread: a running trace's progress.
    """

    def __init__(
        self,
        name: str,
        work: Callable[[BackgroundJob[T]], T],
        subject: Any = None,
        cancel: threading.Event | None = None,
        tick: tuple[float, Callable[[BackgroundJob[T]], None]] | None = None,
    ) -> None:
        """A job called ``name`` (its thread's name) that runs ``work`` for ``subject``; not started yet.

        ``cancel``: the event that cancels it, when the work watches one of its own (a new one otherwise).
        """
        self.name = name
        self.subject = subject
        self.cancel_event = cancel if cancel is not None else threading.Event()
        self.done = threading.Event()
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.thread: threading.Thread | None = None
        self._work: Callable[[BackgroundJob[T]], T] | None = work
        self._tick = tick
        self._finished = False  # set under the lock, as the outcome is published

    def running(self) -> bool:
        """True until the outcome is published (under the widget's lock)."""
        return not self._finished

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel`` was called."""
        return self.cancel_event.is_set()

    def cancel(self) -> None:
        """Ask the work to stop (it checks ``cancelled``, or the event, at its own pace)."""
        self.cancel_event.set()

    def launch(self, lock: threading.RLock, finish: Finish[T], is_current: Callable[[], bool]) -> None:
        """Start the thread: work, then ``finish`` under ``lock`` while ``is_current()``, then resolve."""
        self.thread = threading.Thread(
            target=self._run, args=(lock, finish, is_current), name=self.name, daemon=True
        )
        with _LIVE_LOCK:
            _LIVE.add(self)
        self.thread.start()

    def _run(self, lock: threading.RLock, finish: Finish[T], is_current: Callable[[], bool]) -> None:
        """The job's thread."""
        ticker = None
        if self._tick is not None:
            ticker = threading.Thread(target=self._ticks, name=f"{self.name}-progress", daemon=True)
            ticker.start()
        result: T | None = None
        error: BaseException | None = None
        work, self._work = self._work, None  # the work's closure (a predecessor job, say) is not kept
        assert work is not None, "a job runs once"
        try:
            result = work(self)
        except BaseException as exc:  # anything the work raises is the panel's to show, and the future's
            error = exc
        try:
            with lock:
                self._finished = True
                if is_current():
                    finish(self, result, error)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            self.done.set()
            if error is None:
                self.future.set_result(result)  # type: ignore[arg-type]
            else:
                self.future.set_exception(error)
            if ticker is not None:
                ticker.join()

    def _ticks(self) -> None:
        """Call ``tick`` every ``every`` seconds until the job is done."""
        assert self._tick is not None
        every, tick = self._tick
        while not self.done.wait(every):
            tick(self)


class JobSlot(Generic[T]):
    """A panel's current background job: starting one supersedes the last, whose outcome is then not published.

    ``job`` stays the last job started (finished or not) until the next one; ``running`` says whether it is
    still working. The slot shares the widget's lock: ``start`` is called under it, and ``finish`` runs under it.
    """

    def __init__(self, lock: threading.RLock, name: str) -> None:
        """An empty slot whose jobs' threads are called ``name``."""
        self._lock = lock
        self.name = name
        self.job: BackgroundJob[T] | None = None

    @property
    def running(self) -> bool:
        """Whether the current job is still working."""
        return self.job is not None and self.job.running()

    def start(
        self,
        work: Callable[[BackgroundJob[T]], T],
        finish: Finish[T],
        subject: Any = None,
        cancel: threading.Event | None = None,
        tick: tuple[float, Callable[[BackgroundJob[T]], None]] | None = None,
    ) -> BackgroundJob[T]:
        """Start a job (under the lock) as the current one: ``work`` in its thread, then ``finish``."""
        job: BackgroundJob[T] = BackgroundJob(self.name, work, subject, cancel, tick)
        self.job = job
        job.launch(self._lock, finish, lambda: self.job is job)
        return job


def stop_all(timeout: float = EXIT_JOIN_S) -> int:
    """Cancel every running job and wait for their threads, ``timeout`` seconds in all; the number still running.

    Registered with ``atexit``: a kernel shut down while a trace or a calibration runs stops them before the
    interpreter finalises (a daemon thread still inside torch then can abort the process). A job whose work does
    not watch its cancel flag (a calibration between two traces) is waited for up to the bound, then left."""
    with _LIVE_LOCK:
        jobs = list(_LIVE)
    for job in jobs:
        job.cancel()
    end = time.monotonic() + timeout
    for job in jobs:
        if job.thread is not None and job.thread is not threading.current_thread():
            job.thread.join(max(0.0, end - time.monotonic()))
    return sum(1 for job in jobs if job.thread is not None and job.thread.is_alive())


atexit.register(stop_all)
