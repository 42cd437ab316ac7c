"""What starting the ``memsim`` CLI costs: the import time beyond numpy and pandas, and a process's wall time.

Runs each command in a fresh interpreter with ``-X importtime`` (best of ``--runs``: the machine is shared, the
minimum is the least disturbed run) and prints, per command: the total import time of the process (interpreter
start-up included), the part numpy and pandas take (whoever imports them), the rest ("beyond numpy+pandas"), the
part under ``memsim_widget`` imports (the package and what it pulls in first, numpy and pandas taken out: issue
28's target is under 40 ms), how many ``memsim_widget.families`` modules were imported, and the wall time of the
whole process.

    python benchmarks/cli_startup.py [--runs 7] [--baseline REV]

``--baseline REV`` measures the package as it was at git revision ``REV`` too (``git archive`` into a temporary
folder), its runs interleaved with this tree's so that both see the same load, and prints each command's
before -> after and their ratio: the shared machine's noise moves both alike.

Family modules imported through ``importlib.import_module`` do not print an importtime line of their own (their
cost lands in the caller's), so the count of loaded families is read from ``sys.modules`` at exit instead.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The commands measured: the CLI's help, and one plain estimate (a preset on its default GPU).
COMMANDS: dict[str, list[str]] = {
    "memsim --help": ["-m", "memsim_widget.cli", "--help"],
    "memsim estimate --model llama-3.1-8b": [
        "-m",
        "memsim_widget.cli",
        "estimate",
        "--model",
        "llama-3.1-8b",
    ],
}
#: Appended to each run: print how many family modules the process imported (read at exit).
_COUNT = (
    "import atexit, sys; atexit.register(lambda: print('FAMILIES', "
    "sum(1 for m in list(sys.modules) if m.startswith('memsim_widget.families.')), file=sys.stderr))"
)
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( +)(\S+)$")


def parse(stderr: str) -> dict[str, float]:
    """Import times (ms) and the family modules loaded, from one ``-X importtime`` run's stderr.

    ``-X importtime`` prints a module after everything it imported (children first), so the numpy or pandas lines
    seen since the last top-level line belong to the next top-level line."""
    total = heavy = package = 0.0
    pending = 0.0  # numpy/pandas time inside the top-level import not yet printed
    families = 0
    for line in stderr.splitlines():
        if line.startswith("FAMILIES "):
            families = int(line.split()[1])
        m = _LINE.match(line)
        if not m:
            continue
        ms, indent, name = int(m.group(2)) / 1000, len(m.group(3)), m.group(4)
        if name in ("numpy", "pandas"):  # first (and only) import of each: its whole subtree
            heavy += ms
            pending += ms
        if indent == 1:  # a top-level import: its cumulative time holds everything below it
            total += ms
            if name == "memsim_widget" or name.startswith("memsim_widget."):
                package += ms - pending
            pending = 0.0
    return {
        "total": total,
        "numpy+pandas": heavy,
        "beyond": total - heavy,
        "package": package,
        "families": families,
    }


def run_once(args: list[str], root: Path) -> dict[str, float]:
    """One fresh process of a command with the package of ``root``: its import times and wall time (ms)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    run = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            f"{_COUNT}; import runpy, sys; sys.argv = ['memsim'] + "
            f"{args[2:]!r}; runpy.run_module({args[1]!r}, run_name='__main__')",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=root,
    )
    wall = (time.perf_counter() - t0) * 1000
    if run.returncode != 0:
        raise SystemExit(f"{args}: exit {run.returncode}\n{run.stderr[-2000:]}")
    return {**parse(run.stderr), "wall": wall}


def measure(args: list[str], runs: int, roots: tuple[Path, ...] = (ROOT,)) -> list[dict[str, float]]:
    """The best of ``runs`` fresh processes for one command (the least ``memsim_widget`` import time), per package
    root; the roots' runs alternate, so that each sees the same load."""
    best: list[dict[str, float]] = [{} for _ in roots]
    for _ in range(runs):
        for i, root in enumerate(roots):
            row = run_once(args, root)
            if not best[i] or row["package"] < best[i]["package"]:
                best[i] = row
    return best


def baseline_tree(rev: str, into: Path) -> Path:
    """The package as it was at git revision ``rev``, written under ``into`` and byte-compiled."""
    archive = into / "package.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", rev, "memsim_widget"], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into / "memsim_widget")], check=True)
    return into


def _row(label: str, r: dict[str, float]) -> str:
    return (
        f"{label:<46} {r['total']:>10.1f} {r['numpy+pandas']:>12.1f} {r['beyond']:>8.1f} "
        f"{r['package']:>13.1f} {int(r['families']):>8d} {r['wall']:>8.0f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline", metavar="REV", help="also measure the package at this git revision")
    opts = ap.parse_args()
    # Byte-compile first (as an installed package is): a process that compiles the sources measures the compiler.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "memsim_widget")], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        roots = (ROOT,) if opts.baseline is None else (baseline_tree(opts.baseline, Path(tmp)), ROOT)
        print(
            f"{'command':<46} {'imports ms':>10} {'numpy+pandas':>12} {'beyond':>8} {'memsim_widget':>13} "
            f"{'families':>8} {'wall ms':>8}"
        )
        for label, args in COMMANDS.items():
            rows = measure(args, opts.runs, roots)
            if len(rows) == 1:
                print(_row(label, rows[0]))
                continue
            before, after = rows
            print(_row(f"{label} @{opts.baseline}", before))
            print(_row(label, after))
            ratio = {
                k: after[k] / before[k] if before[k] else float("nan") for k in ("beyond", "package", "wall")
            }
            print(
                f"{'  after / before':<46} {'':>10} {'':>12} {ratio['beyond']:>8.2f} {ratio['package']:>13.2f} "
                f"{'':>8} {ratio['wall']:>8.2f}"
            )


if __name__ == "__main__":
    main()
