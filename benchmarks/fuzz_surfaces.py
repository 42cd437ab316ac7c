"""The export, files and widget suites of ``benchmarks/fuzz.py`` (issue 25): each prints its counts and returns 1
when any uncaught exception, hang over ``HANG_S`` or destroyed file was seen."""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: A case that takes longer is a hang.
HANG_S = 10.0


def _settings(args: argparse.Namespace, share: int = 1) -> Callable[[Any], Any]:
    return settings(
        max_examples=max(1, args.examples // share),
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def _timed(call: Callable[[], Any]) -> tuple[str, Any, float]:
    """('ok' | 'hang' | 'error', value or exception, seconds) of ``call`` in a daemon thread bounded by HANG_S."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 -- classified by the caller
            box["error"] = exc

    t0 = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    secs = time.perf_counter() - t0
    if thread.is_alive():
        return "hang", None, secs
    if "error" in box:
        return "error", box["error"], secs
    return "ok", box.get("value"), secs


def _report(name: str, counts: collections.Counter[str], secs: float, problems: list[str]) -> int:
    total = sum(counts.values())
    print(f"{name}: {total:,} cases in {secs:.1f} s")
    for kind, n in sorted(counts.items()):
        print(f"  {kind:22s} {n:7,}")
    for p in problems[:10]:
        print(f"  PROBLEM {p}")
    bad = sum(counts[k] for k in ("uncaught", "hang", "destroyed", "broken"))
    print(f"  uncaught {counts['uncaught']}, hangs > {HANG_S:.0f} s {counts['hang']}, destroyed files "
          f"{counts['destroyed']}, broken files {counts['broken']}")  # fmt: skip
    return 1 if bad else 0


# ----- export: hostile names, then writes with faults ----------------------------------------------------------
def _write_with_fault(files: dict[str, str], rng: random.Random) -> str:
    """Write ``files`` into a folder holding old files and a planted link, failing at a random step; 'written',
    'refused' or 'destroyed' (the folder is neither the old content nor the whole export, or the link's target
    changed)."""
    from memsim_widget.errors import ScenarioError
    from memsim_widget.export import files as files_mod

    with tempfile.TemporaryDirectory() as tmp:
        out, victim = Path(tmp) / "out", Path(tmp) / "victim"
        out.mkdir()
        victim.write_text("precious")
        names = list(files)
        old = {n: f"old {n}" for n in names if rng.random() < 0.5}
        for n, text in old.items():
            (out / n).write_text(text)
        if rng.random() < 0.2:
            link = rng.choice(names)
            (out / link).unlink(missing_ok=True)
            old.pop(link, None)
            (out / link).symlink_to(victim)
        force, fail_at = rng.random() < 0.6, rng.choice([None, 1, 2, 3, 4])
        before = _snapshot(out)
        calls = {"n": 0}
        real_fsync, real_replace = files_mod.os.fsync, files_mod.os.replace

        def step() -> None:
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise OSError(28, "No space left on device")

        files_mod.os.fsync = lambda fd: (step(), real_fsync(fd))[1]  # type: ignore[assignment]
        files_mod.os.replace = lambda a, b: (step(), real_replace(a, b))[1]  # type: ignore[assignment]
        try:
            files_mod.write_files(files, out, force=force)
            result = "written"
        except ScenarioError:
            result = "refused"
        finally:
            files_mod.os.fsync, files_mod.os.replace = real_fsync, real_replace
        after = _snapshot(out)
        whole = {**{k: v for k, v in before.items() if k not in files}, **files}
        expected = whole if result == "written" else before
        if victim.read_text() != "precious" or after != expected:
            return "destroyed"
        return result


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_text()) for p in folder.iterdir()}


def export_suite(args: argparse.Namespace) -> int:
    """Hostile GPU names in every format, each export then written with a fault."""
    from test_export_hostile import BASE, NAMES, _refused_or_round_trips

    from memsim_widget.errors import ScenarioError
    from memsim_widget.export import FORMATS, export
    from memsim_widget.scenario import Scenario

    counts: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    rng = random.Random(args.seed)

    @seed(args.seed)
    @_settings(args, 4)
    @given(name=NAMES, fmt=st.sampled_from(list(FORMATS)))
    def draw(name: str, fmt: str) -> None:
        gpu = {"memory_gib": 80, "name": name}
        data, benign = {**BASE[fmt], "gpu": gpu}, {**BASE[fmt], "gpu": {**gpu, "name": "x"}}
        kind, err, _ = _timed(lambda: _refused_or_round_trips(data, fmt, benign, "gpu"))
        if kind != "ok":
            counts[
                "hang" if kind == "hang" else ("broken" if isinstance(err, AssertionError) else "uncaught")
            ] += 1
            problems.append(f"{fmt} {name!r}: {kind} {err!r:.200}")
            return
        try:
            files = export(Scenario.from_dict(data), fmt)
        except ScenarioError:
            counts["name refused"] += 1
            return
        counts["exported, parses"] += 1
        kind, result, _ = _timed(lambda: _write_with_fault(files, rng))
        if kind != "ok":
            counts["hang" if kind == "hang" else "uncaught"] += 1
            problems.append(
                f"write {fmt}: {kind} {''.join(traceback.format_exception_only(result)).strip():.200}"
            )
        else:
            counts[f"write {result}" if result != "destroyed" else "destroyed"] += 1

    t0 = time.perf_counter()
    draw()
    return _report("export", counts, time.perf_counter() - t0, problems)


# ----- files: special files and abuse sizes --------------------------------------------------------------------
def files_suite(args: argparse.Namespace) -> int:
    """Every special file and abuse size, as the scenario file and as the model path, through the CLI."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from memsim_widget.cli import main

    counts: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        fifo = base / "fifo.json"
        os.mkfifo(fifo)
        (base / "folder").mkdir()
        dup = base / "dup.json"
        dup.write_text('{"seq_len": 1, "seq_len": 2}')
        big = base / "big.json"
        big.write_text('{"model": {"model_type": "llama", "hidden_size": ' + "9" * 200 + "}}")
        paths = [str(fifo), "/dev/zero", "/dev/null", str(base / "folder"), str(dup), str(big), "a\x00b.json",
                 "a\udcffb.json", str(base / "missing.json")]  # fmt: skip
        argvs = [["estimate", p] for p in paths] + [["estimate", "--model", p] for p in paths]
        argvs += [["estimate", "--pp", str(2**20)], ["plan", "--top", str(10**9), "--json"],
                  ["plan", "--gpus", ",".join(map(str, range(1, 2001)))], ["estimate", "--seq-len", "9" * 5000]]  # fmt: skip
        rounds = max(1, args.examples // (len(argvs) * 50))
        for _ in range(rounds):
            for argv in argvs:
                err = io.StringIO()

                def run(argv: list[str] = argv, err: io.StringIO = err) -> int:
                    with redirect_stdout(io.StringIO()), redirect_stderr(err):
                        try:
                            return main(argv)
                        except SystemExit as exc:
                            return exc.code if isinstance(exc.code, int) else 1

                kind, code, _ = _timed(run)
                text = err.getvalue()
                if (
                    kind == "ok"
                    and code == 2
                    and text.count("\n") == 1
                    and text.startswith("memsim: error: ")
                ):
                    counts["one line, exit 2"] += 1
                elif kind == "hang":
                    counts["hang"] += 1
                    problems.append(f"{argv!r:.120}: hang")
                else:
                    counts["uncaught"] += 1
                    problems.append(f"{argv!r:.120}: {kind} {code!r} {text[-200:]!r}")
    return _report("files", counts, time.perf_counter() - t0, problems)


# ----- widget: front-end operation sequences -------------------------------------------------------------------
def widget_suite(args: argparse.Namespace) -> int:
    """Sequences of junk edits, trait writes and messages on one widget; a valid edit must apply afterwards."""
    from widget.test_widget_abuse import OPS

    from memsim_widget.widget import MemSim

    sim = MemSim(charts_js=False)
    good = dict(sim.scenario_data)
    counts: collections.Counter[str] = collections.Counter()
    problems: list[str] = []

    def apply(ops: list[Any]) -> None:
        for kind, key, value in ops:
            if kind == "edit":
                sim.scenario_data = {**sim.scenario_data, key: value}
            elif kind == "state":
                sim.set_state({key: value})
            else:
                sim._on_front_msg(sim, {"type": key, "format": value, "gpus": value, "index": value}, [])
            counts["operations"] += 1
        sim.set_state({"fit_open": False, "headroom": 0.1})
        sim.scenario_data = {**good, "micro_batch_size": 2}
        assert sim.error == "" and sim.scenario.micro_batch_size == 2, sim.error
        sim.scenario_data = good

    @seed(args.seed)
    @_settings(args, 20)
    @given(ops=OPS)
    def draw(ops: list[Any]) -> None:
        kind, err, _ = _timed(lambda: apply(ops))
        if kind == "ok":
            counts["sequences, recovered"] += 1
        else:
            counts["hang" if kind == "hang" else "uncaught"] += 1
            problems.append(f"{ops!r:.200}: {kind} {err!r:.200}")

    t0 = time.perf_counter()
    draw()
    return _report("widget", counts, time.perf_counter() - t0, problems)


SUITES: dict[str, Callable[[argparse.Namespace], int]] = {
    "export": export_suite,
    "files": files_suite,
    "widget": widget_suite,
}
