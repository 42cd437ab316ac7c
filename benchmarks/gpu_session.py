"""UNTESTED ON GPU. One lent GPU session's measurements for the open issues, in priority order, inside ~9.5 minutes
(a session has 15 minutes of device time, 10 per command): everything goes under one output directory, each
stage's output is flushed as it goes, and progress is printed.

Stages (the time a stage leaves unused flows to the next; ``--only`` picks some):
  1. oom        benchmarks/gpu_oom_boundary.py: the OOM boundary under emulated 24/40/48/80 GB cards
                -> OUT/measured/oom_boundary_<card>.csv (issue 22 item 5b; the most valuable)
  2. snapshots  benchmarks/gpu_snapshots.py: allocator snapshots of step 3 -> OUT/snapshots/<name>.json (5a)
  3. expandable benchmarks/gpu_measure.py --alloc-conf expandable_segments:True, the most telling scenarios first
                -> OUT/measured/gpu_<host>_expandable.csv (5b)
  4. parallel   benchmarks/gpu_measure_parallel.py: one FSDP2 / TP rank under the fake process group
                -> OUT/parallel.jsonl (5c)
Also OUT/env.json (device, total_memory, versions, nvidia-smi) and OUT/session.log (all output).

Run on the device (the repository root as working directory; memsim_widget importable from it):
    python benchmarks/gpu_session.py --out "$OUT"
    python benchmarks/gpu_session.py --out "$OUT" --only oom --total 400
    python benchmarks/gpu_session.py --cpu-smoke --out /tmp/s     # every stage's --cpu-smoke, small budgets
Afterwards, on any machine: copy OUT/measured/*.csv to data/measured/, OUT/snapshots to data/measured/snapshots,
then ``python benchmarks/oom_boundary_compare.py`` and ``python benchmarks/gpu_snapshots.py --compare
data/measured/snapshots`` (docs/allocator.md, "Held to a real GPU"). A later session skips what data/measured
already holds (boundary rows that are exact, snapshots and expandable rows present) and measures the rest.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
#: The whole session: 9.5 minutes, leaving room in a 10-minute command for start-up and the copy back.
TOTAL_SECONDS = 570
#: The expandable-segments rerun, most telling first (variable lengths, checkpointing, LoRA, the loss buffers);
#: then every other measurement of gpu_measure.py (``expandable_order``).
EXPANDABLE_FIRST = ("qwen05b-bf16-longest", "llama1b-bf16", "llama1b-bf16-ckpt", "llama1b-lora", "qwen05b-bf16",
                    "gpt2m-amp-eager", "llama8b-bf16-fused", "llama8b-lora", "llama1b-bf16-fused", "llama1b-amp")  # fmt: skip
#: Where a session's results are committed; a later session skips what is there (``pending``).
DATA = ROOT / "data" / "measured"


def expandable_order() -> list[str]:
    """Every gpu_measure.py measurement, ``EXPANDABLE_FIRST`` first."""
    sys.path.insert(0, str(BENCH))
    import gpu_measure

    rest = [m.name for m in gpu_measure.MEASUREMENTS if m.name not in EXPANDABLE_FIRST]
    return [*EXPANDABLE_FIRST, *rest]


def pending(stage: str, data: Path = DATA) -> list[str]:
    """What a stage still has to measure, given the results committed under ``data`` (all of it at first)."""
    if stage == "snapshots":
        sys.path.insert(0, str(BENCH))
        import gpu_snapshots

        done = {p.stem for p in (data / "snapshots").glob("*.json")}
        return [s.name for s in gpu_snapshots.SNAPSHOTS if s.name not in done]
    if stage == "expandable":
        ids = set()
        for p in data.glob("gpu_*_expandable.csv"):
            with open(p, newline="") as f:
                ids |= {r["id"] for r in csv.DictReader(f)}
        return [n for n in expandable_order() if f"g-{n}-expandable-reserved" not in ids]
    return []


def seed_boundary(out: Path, data: Path = DATA) -> None:
    """Copy the committed boundary CSVs into ``out/measured`` so that ``--resume`` searches only the rest."""
    (out / "measured").mkdir(parents=True, exist_ok=True)
    for p in data.glob("oom_boundary_*.csv"):
        target = out / "measured" / p.name
        if not target.exists():
            shutil.copyfile(p, target)


@dataclass(frozen=True)
class Stage:
    """One script run: its name, nominal seconds, and its command for an output directory and a budget."""

    name: str
    seconds: int

    def command(
        self, out: Path, budget: float, host: str, smoke: bool, data: Path = DATA
    ) -> list[str] | None:
        """The stage's command line; None when the committed data leaves it nothing to do."""
        py, b = sys.executable, str(int(budget))
        s = ["--cpu-smoke"] if smoke else []
        if self.name == "oom":  # resumed from the committed rows (seed_boundary): exact rows are not redone
            cards = ["--cards", "rtx-4090", "l40s", "--only", "smoke-full"] if smoke else ["--resume"]
            return [py, str(BENCH / "gpu_oom_boundary.py"), "--out-dir", str(out / "measured"), "--budget", b,
                    *cards, *s]  # fmt: skip
        if self.name == "snapshots":
            only = ["smoke-tiny"] if smoke else pending("snapshots", data)
            if not only:
                return None
            return [py, str(BENCH / "gpu_snapshots.py"), "--out-dir", str(out / "snapshots"), "--budget", b,
                    "--only", *only, *s]  # fmt: skip
        if self.name == "expandable":
            only = EXPANDABLE_FIRST[:2] if smoke else pending("expandable", data)
            if not only:
                return None
            return [py, str(BENCH / "gpu_measure.py"), "--alloc-conf", "expandable_segments:True", "--only", *only,
                    "--out", str(out / "measured" / f"gpu_{host}_expandable.csv"), "--budget", b, *s]  # fmt: skip
        return [
            py,
            str(BENCH / "gpu_measure_parallel.py"),
            "--out",
            str(out / "parallel.jsonl"),
            "--budget",
            b,
            *s,
        ]


STAGES = (Stage("oom", 290), Stage("snapshots", 110), Stage("expandable", 110), Stage("parallel", 60))


#: Run in a subprocess: the session's own process never creates a CUDA context (it would sit on the GPU beside
#: every measurement).
_DEVICE_INFO = """
import json, torch
p = torch.cuda.get_device_properties(0)
print(json.dumps({"device": p.name, "total_memory": int(p.total_memory), "cuda": str(torch.version.cuda)}))
"""


def _version(name: str) -> str:
    """An installed package's version, or 'missing'."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def environment(out: Path, smoke: bool) -> str:
    """Write OUT/env.json; the host card's catalog id (the expandable rows' file name)."""
    import torch
    import transformers

    from memsim_widget.catalog.gpus import canonical_gpu_id

    env: dict[str, object] = {"python": sys.version.split()[0], "torch": torch.__version__,
                              "transformers": transformers.__version__, "bitsandbytes": _version("bitsandbytes"),
                              "peft": _version("peft"), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}  # fmt: skip
    host = "cpu"
    if not smoke:
        try:
            info = subprocess.run(
                [sys.executable, "-c", _DEVICE_INFO], capture_output=True, text=True, timeout=120
            )
            env.update(json.loads(info.stdout.strip().splitlines()[-1]))
            host = canonical_gpu_id(str(env["device"])) or "gpu"
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            env["device"] = "unknown (the device query failed)"
        env["catalog_id"] = host
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi"], capture_output=True, text=True, timeout=20
            ).stdout
        except (OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = "unavailable"
    out.mkdir(parents=True, exist_ok=True)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    return host


#: What every stage imports; bitsandbytes is optional (the QLoRA case is skipped without it).
NEEDED = ("torch", "transformers", "peft", "memsim_widget.measure", "memsim_widget.trace.hf")


def preflight() -> str:
    """'' when every module the stages import is there, else one line naming the missing ones (so that a
    session's minutes are not spent on stages that would all fail at their first import)."""
    import importlib

    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    return "cannot import " + "; ".join(missing) if missing else ""


def run_stage(cmd: list[str], seconds: float, log: Path) -> int:
    """Run one stage in its own process group, its output printed and logged; killed (the group) past
    ``seconds``. Its exit status (124 when killed)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                env=env, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + seconds
        killer = _Killer(proc, deadline)
        killer.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            fh.write(line)
            fh.flush()
        proc.wait()
        killer.stop()
    return 124 if killer.killed else proc.returncode


class _Killer:
    """Kill a process group at a deadline (a thread: the stage's output is read meanwhile)."""

    def __init__(self, proc: subprocess.Popen, deadline: float) -> None:
        import threading

        self.proc, self.deadline, self.killed = proc, deadline, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        if not self._stop.wait(max(self.deadline - time.monotonic(), 0)) and self.proc.poll() is None:
            self.killed = True
            os.killpg(self.proc.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_session_out")))
    ap.add_argument("--total", type=float, default=TOTAL_SECONDS, help="seconds for every stage together")
    ap.add_argument("--only", nargs="*", choices=[s.name for s in STAGES])
    ap.add_argument("--cpu-smoke", action="store_true", help="every stage's --cpu-smoke (no GPU needed)")
    args = ap.parse_args(argv)
    if not args.cpu_smoke:
        import torch

        if not torch.cuda.is_available():
            print(
                "gpu_session: no CUDA device (--cpu-smoke runs every stage's logic on CPU)", file=sys.stderr
            )
            return 2
    missing = preflight()
    if missing:
        print(f"gpu_session: {missing}", file=sys.stderr)
        return 2
    start = time.monotonic()
    host = environment(args.out, args.cpu_smoke)
    if not args.cpu_smoke:
        seed_boundary(args.out)
    stages = [s for s in STAGES if not args.only or s.name in args.only]
    nominal = sum(s.seconds for s in stages)
    log, status = args.out / "session.log", {}
    for i, s in enumerate(stages):
        left = args.total - (time.monotonic() - start)
        later = sum(x.seconds for x in stages[i + 1 :]) * args.total / nominal
        budget = max(left - later, 0)  # its share, plus whatever the stages before it left unused
        if budget < 20:
            print(f"== {s.name}: skipped, {budget:.0f} s left for it", flush=True)
            status[s.name] = "skipped"
            continue
        cmd = s.command(args.out, budget - 20, host, args.cpu_smoke)
        if cmd is None:
            print(f"== {s.name}: nothing left to measure (data/measured holds it)", flush=True)
            status[s.name] = "done before"
            continue
        print(f"== {s.name}: budget {budget:.0f} s (session at {time.monotonic() - start:.0f} s)", flush=True)
        # the script keeps inside its --budget; the process group is killed 20 s past it
        rc = run_stage(cmd, budget, log)
        status[s.name] = f"exit {rc}"
        print(f"== {s.name}: exit {rc} at {time.monotonic() - start:.0f} s", flush=True)
    (args.out / "status.json").write_text(json.dumps(status, indent=1))
    print(
        f"gpu_session: done in {time.monotonic() - start:.0f} s: {status}; outputs under {args.out}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
