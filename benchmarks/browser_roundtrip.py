"""Browser round trip of one widget update in a real JupyterLab: key press on a control -> new result on screen.

Usage: ``python benchmarks/browser_roundtrip.py [--presses 10] [--json]`` (needs /usr/bin/chromium, the
``playwright`` package and JupyterLab; runs offline on 127.0.0.1, about 40 s).

It serves a one-cell notebook (``MemSim()`` at the default scenario) with the same JupyterLab and headless
Chromium setup as ``tests/browser/test_jupyterlab.py``, then presses an arrow key on a focused control and
times, in the page, from the ``keydown`` event to:

* **result**: the next frame after the verdict panel was redrawn from Python's new ``result`` (kernel message
  out, estimate, traits back, DOM update, paint);
* **breakdown**: the next frame after the breakdown chart was redrawn by vega-embed;
* **all charts**: the next frame after the last chart (the scaling view) was redrawn.

Two controls: the micro-batch slider (ArrowRight from 1 to 1024: every value a new estimate) and the GPU
dropdown (ArrowDown through the catalog). Between presses the page waits until both charts are quiet. The
Python-side time of the same updates (``MemSim.last_update_ms``: validate, estimate, scaling sweep, specs) is
read from the kernel after each press. Medians are printed; the target is a round trip under 150 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from jlab import chromium_available, chromium_page, jupyter_lab, kernel_json, open_notebook, run_all_cells  # noqa: E402

TARGET_MS = 150.0
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "roundtrip",
            "metadata": {},
            "outputs": [],
            "source": "from memsim_widget import MemSim\nsim = MemSim()\nsim",
        }
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}
#: In-page timers: keydown on a widget control starts a measurement; mutation observers on the verdict panel
#: and the two charts record the next animation frame after their latest change.
INSTRUMENT_JS = """() => {
  const st = (window.__rt = { t0: null, result: null, breakdown: null, scaling: null, last: 0 });
  document.addEventListener('keydown', (e) => {
    if (e.target.closest && e.target.closest('.memsim')) {
      Object.assign(st, { t0: performance.now(), result: null, breakdown: null, scaling: null });
    }
  }, true);
  const watch = (sel, key) => new MutationObserver(() => {
    if (st.t0 === null) return;
    st.last = performance.now();
    requestAnimationFrame(() => { st[key] = performance.now(); });
  }).observe(document.querySelector(sel), { childList: true, subtree: true, characterData: true });
  watch('.memsim-verdict', 'result');
  watch('.memsim-chart-breakdown', 'breakdown');
  watch('.memsim-chart-scaling', 'scaling');
}"""
#: Done when the result and both charts were redrawn and nothing changed for 250 ms.
SETTLED_JS = """() => {
  const st = window.__rt;
  return st.result !== null && st.breakdown !== null && st.scaling !== null
    && performance.now() - st.last > 250 && document.querySelector('.memsim-chart-scaling svg') !== null;
}"""
READ_JS = """() => { const st = window.__rt;
  return { result: st.result - st.t0, breakdown: st.breakdown - st.t0, charts: Math.max(st.breakdown, st.scaling) - st.t0 };
}"""


def measure(page: Any, selector: str, key: str, presses: int, read: str) -> list[dict[str, Any]]:
    """Press ``key`` on the focused control ``presses`` times; one timing record per update."""
    out = []
    page.locator(selector).focus()
    for _ in range(presses):
        page.keyboard.press(key)
        page.wait_for_function(SETTLED_JS, timeout=60_000, polling=50)
        rec = page.evaluate(READ_JS)
        py = kernel_json(page, f"{{'value': {read}, 'python_ms': sim.last_update_ms, 'error': sim.error}}")
        if py["error"]:
            raise RuntimeError(f"{selector}: {py['error']}")
        out.append({**rec, **py})
    return out


def summarise(name: str, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (ms) of one control's updates."""
    return {
        "control": name,
        "updates": len(recs),
        "values": [r["value"] for r in recs],
        "result_ms": round(statistics.median(r["result"] for r in recs), 1),
        "breakdown_ms": round(statistics.median(r["breakdown"] for r in recs), 1),
        "charts_ms": round(statistics.median(r["charts"] for r in recs), 1),
        "python_ms": round(statistics.median(r["python_ms"] for r in recs), 1),
        "result_max_ms": round(max(r["result"] for r in recs), 1),
    }


def main() -> int:
    """Run the benchmark; exit status 1 if the median result round trip misses the target."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presses", type=int, default=10, help="updates per control (default 10, at most 10)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    reason = chromium_available()
    if reason:
        print(f"skipped: {reason}", file=sys.stderr)
        return 0
    n = max(1, min(args.presses, 10))
    with (
        jupyter_lab({"roundtrip.ipynb": json.dumps(NOTEBOOK)}) as lab,
        chromium_page() as (page, outside, errors),
    ):
        open_notebook(page, lab, "roundtrip.ipynb")
        cell_errors = run_all_cells(page)
        if cell_errors:
            raise RuntimeError(f"notebook failed: {cell_errors}")
        page.wait_for_selector(".memsim-chart-scaling svg .mark-area path", timeout=60_000)
        page.evaluate(INSTRUMENT_JS)
        slider = measure(
            page, ".memsim-ctl-micro_batch_size", "ArrowRight", n, "sim.scenario.micro_batch_size"
        )
        gpus = page.eval_on_selector_all(".memsim-ctl-gpu option", "os => os.map(o => o.value)")
        start = gpus.index(page.input_value(".memsim-ctl-gpu"))
        steps = min(n, len(gpus) - 2 - start)  # stop before the 'custom' entry
        key = "ArrowDown"
        if steps < 1:
            steps, key = min(n, start), "ArrowUp"
        dropdown = measure(page, ".memsim-ctl-gpu", key, steps, "sim.scenario.gpu")
        if outside:
            raise RuntimeError(f"requests left 127.0.0.1: {outside}")
    rows = [summarise("micro-batch slider", slider), summarise("GPU dropdown", dropdown)]
    both = slider + dropdown
    overall = {
        "result_ms": round(statistics.median(r["result"] for r in both), 1),
        "breakdown_ms": round(statistics.median(r["breakdown"] for r in both), 1),
        "charts_ms": round(statistics.median(r["charts"] for r in both), 1),
        "python_ms": round(statistics.median(r["python_ms"] for r in both), 1),
        "updates": len(both),
        "target_ms": TARGET_MS,
    }
    ok = overall["result_ms"] < TARGET_MS
    if args.json:
        print(json.dumps({"controls": rows, "overall": overall, "ok": ok}, indent=2))
        return 0 if ok else 1
    print("MemSim browser round trip in JupyterLab (key press -> redrawn on screen), medians")
    head = ("control", "updates", "result", "breakdown", "all charts", "python", "worst result")
    print(f"  {head[0]:<20}{head[1]:>8}{head[2]:>11}{head[3]:>12}{head[4]:>13}{head[5]:>11}{head[6]:>15}")
    for r in [*rows, {**overall, "control": "all", "result_max_ms": max(x["result_max_ms"] for x in rows)}]:
        print(
            f"  {r['control']:<20}{r['updates']:>8}{r['result_ms']:>8.1f} ms{r['breakdown_ms']:>9.1f} ms"
            f"{r['charts_ms']:>10.1f} ms{r['python_ms']:>8.1f} ms{r['result_max_ms']:>12.1f} ms"
        )
    verdict = "meets" if ok else "MISSES"
    print(f"result round trip {overall['result_ms']:.1f} ms {verdict} the {TARGET_MS:.0f} ms target")
    print("  result: the verdict panel (from Python's new result) painted; breakdown: the breakdown chart")
    print("  painted; all charts: the scaling view painted too; python: MemSim.last_update_ms (validate,")
    print("  estimate, scaling sweep, specs, send) of the same updates")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
