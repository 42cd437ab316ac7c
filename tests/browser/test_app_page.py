"""The page without Jupyter (``memsim app``, Voila) driven in headless Chromium with the keyboard, offline.

Starts ``python -m memsim_widget.cli app`` on 127.0.0.1 (a free port, private Jupyter folders), opens the page,
waits for the widget's verdict and breakdown chart, moves the micro-batch slider one stop with an arrow key,
and checks that the page shows what the engine computes for the new micro-batch (worked out here, in the test
process, from the same default scenario): the verdict word and the allocated peak. No page error, no request
leaving 127.0.0.1, and the page holds no code cell. Screenshots go to ``artifacts/browser/`` (git-ignored).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from jlab import ROOT, chromium_available, chromium_page, free_port, stop, wait_http_ok

ARTIFACTS = ROOT / "artifacts" / "browser"
BARS = ".memsim-chart-breakdown svg .mark-rect path"
CHART_JS = """(sel) => [...document.querySelectorAll(sel)].map((p) => p.getAttribute('d')).join('|')"""
VERDICT_JS = "() => document.querySelector('.memsim-verdict')?.innerText ?? ''"


def _skip_reason() -> str | None:
    reason = chromium_available()
    if reason is None and importlib.util.find_spec("voila") is None:
        reason = 'Voila is not installed (pip install "memsim-widget[app]")'
    return reason


SKIP = _skip_reason()


@contextmanager
def memsim_app() -> Iterator[str]:
    """``memsim app`` on a free loopback port with private Jupyter folders; yields its base URL."""
    tmp = Path(tempfile.mkdtemp(prefix="memsim-app-"))
    env = {
        **os.environ,
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    port = free_port()
    log = tmp / "app.log"
    cmd = [sys.executable, "-m", "memsim_widget.cli", "app", "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{base}/", proc, log)
        yield base
    finally:
        stop(proc)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, ARTIFACTS / "app.log")
        shutil.rmtree(tmp, ignore_errors=True)


def _expected(micro_batch_size: int | None = None) -> dict[str, object]:
    """What the engine shows for the default scenario (or it with another micro-batch): verdict, allocated."""
    from memsim_widget import MemSim

    sim = MemSim()
    if micro_batch_size is not None:
        sim.set(micro_batch_size=micro_batch_size)
    allocated = next(p["size"] for p in sim.result["peaks"] if p["key"] == "peak_allocated_bytes")
    return {
        "mb": sim.scenario.micro_batch_size,
        "stops": list(sim.options["stops"]["micro_batch_size"]),
        "verdict": sim.result["verdict"],
        "allocated": allocated,
    }


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
def test_app_page_follows_the_engine_when_the_micro_batch_slider_moves() -> None:
    before = _expected()
    stops, i = before["stops"], before["stops"].index(before["mb"])  # type: ignore[union-attr]
    key, want_mb = ("ArrowRight", stops[i + 1]) if i + 1 < len(stops) else ("ArrowLeft", stops[i - 1])
    after = _expected(want_mb)
    with memsim_app() as base, chromium_page() as (page, outside, errors):
        page.goto(f"{base}/")
        page.wait_for_selector(".memsim-verdict-word", timeout=120_000)
        page.wait_for_selector(BARS, timeout=60_000)
        # The page is the widget alone: Voila hides the code cell.
        assert page.locator(".memsim").count() == 1
        assert page.locator(".jp-InputArea-editor").count() == 0
        assert page.inner_text(".memsim-verdict-word").strip().lower() == before["verdict"]
        assert page.inner_text(".memsim-peak-allocated b") == f"allocated {before['allocated']}"
        verdict0, chart0 = page.evaluate(VERDICT_JS), page.evaluate(CHART_JS, BARS)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "app-before.png"))

        slider = page.locator(".memsim-ctl-micro_batch_size")
        slider.scroll_into_view_if_needed()
        slider.focus()
        page.keyboard.press(key)
        page.wait_for_function(
            f"(before) => {{ const now = ({VERDICT_JS})(); return now && now !== before; }}",
            arg=verdict0,
            timeout=30_000,
            polling=100,
        )
        page.wait_for_function(
            f"([sel, before]) => {{ const now = ({CHART_JS})(sel); return now && now !== before; }}",
            arg=[BARS, chart0],
            timeout=30_000,
            polling=100,
        )
        assert page.inner_text(".memsim-ctl-micro_batch_size ~ output") == str(want_mb)
        assert page.inner_text(".memsim-verdict-word").strip().lower() == after["verdict"]
        assert page.inner_text(".memsim-peak-allocated b") == f"allocated {after['allocated']}"
        assert after["allocated"] != before["allocated"]
        page.screenshot(path=str(ARTIFACTS / "app-after.png"))
        assert errors == [], f"uncaught page errors: {errors}"
        assert outside == [], f"requests left 127.0.0.1: {outside}"
