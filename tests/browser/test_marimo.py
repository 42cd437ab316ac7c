"""The widget in marimo (``mo.ui.anywidget``), driven by headless Chromium, fully offline.

Writes a two-cell marimo app: the first shows ``mo.ui.anywidget(MemSim())`` (the default scenario, charts on),
the second prints what Python holds (micro-batch, verdict, allocated peak) and re-runs whenever the widget's
value changes, as marimo's reactivity does for any cell that reads a UI element. ``marimo run`` serves it on
127.0.0.1 with an access token, its update check off (``MARIMO_SKIP_UPDATE_CHECK=1``; marimo has no other
telemetry) and private config and state folders. The test waits for the verdict and the drawn breakdown
chart, moves the micro-batch slider one stop with the keyboard, and checks that the second cell shows the
new micro-batch, that the page's verdict, allocated peak and chart are redrawn from Python's new result, no
page error and no request leaving 127.0.0.1. marimo renders the widget inside the shadow root of a
``<marimo-anywidget>`` element: page scripts query that root, Playwright's locators pierce it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from jlab import ROOT, chromium_available, chromium_page, free_port, stop, wait_http_ok

ARTIFACTS = ROOT / "artifacts" / "browser"


def _skip_reason() -> str | None:
    reason = chromium_available()
    if reason is not None:
        return reason
    try:
        import marimo  # noqa: F401
    except ImportError:
        return "marimo is not installed"
    return None


SKIP = _skip_reason()
#: The app (marimo's file format). The second cell's text is Python's view, for the test to read.
APP = """import marimo

app = marimo.App(width="full")


@app.cell
def _():
    import marimo as mo
    from memsim_widget import MemSim

    sim = mo.ui.anywidget(MemSim())
    sim
    return mo, sim


@app.cell
def _(mo, sim):
    _w = sim.widget
    _alloc = next(p["size"] for p in _w.result["peaks"] if p["key"] == "peak_allocated_bytes")
    mo.md(
        f"<span class='py-state'>mb={_w.scenario.micro_batch_size};verdict={_w.result['verdict']};"
        f"allocated={_alloc};error={_w.error}</span>"
    )
    return


if __name__ == "__main__":
    app.run()
"""
#: The widget's root inside marimo's ``<marimo-anywidget>`` shadow root (null until it renders).
SHADOW = "(document.querySelector('marimo-anywidget')?.shadowRoot ?? null)"
BARS = ".memsim-chart-breakdown svg .mark-rect path"
CHART_JS = (
    f"""(sel) => [...({SHADOW}?.querySelectorAll(sel) ?? [])].map((p) => p.getAttribute('d')).join('|')"""
)
VERDICT_JS = f"""() => {SHADOW}?.querySelector('.memsim-verdict')?.innerText ?? ''"""


def _python_state(page) -> dict[str, str]:
    """The second cell's text as a dict: what Python holds now."""
    text = page.inner_text(".py-state")
    return dict(part.split("=", 1) for part in text.strip().split(";"))


@pytest.fixture(scope="module")
def marimo_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """``marimo run`` serving the app, open in Chromium: ``page``, ``outside``, ``errors``, ``t0``."""
    if SKIP is not None:
        pytest.skip(SKIP)
    t0 = time.monotonic()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_factory.mktemp("marimo")
    app = tmp / "memsim_app.py"
    app.write_text(APP, encoding="utf-8")
    # PYTEST_CURRENT_TEST would point marimo's update check at pypi.org (it is off anyway).
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(
        MARIMO_SKIP_UPDATE_CHECK="1",
        XDG_CONFIG_HOME=str(tmp / "config"),  # no user marimo.toml
        XDG_STATE_HOME=str(tmp / "state"),
        PYTHONUNBUFFERED="1",
    )
    port, token = free_port(), os.urandom(12).hex()
    log = tmp / "marimo.log"
    cmd = [
        sys.executable,
        "-m",
        "marimo",
        "run",
        str(app),
        "--headless",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--token-password={token}",
        "--no-sandbox",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{base}/health", proc, log, timeout=60)
        with chromium_page() as (page, outside, errors):
            page.goto(f"{base}/?access_token={token}")
            yield SimpleNamespace(page=page, outside=outside, errors=errors, t0=t0, log=log)
    finally:
        stop(proc)
        (ARTIFACTS / "marimo.log").write_bytes(log.read_bytes())


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
def test_widget_in_marimo_reacts_to_the_micro_batch_slider(marimo_app: SimpleNamespace) -> None:
    page, outside, errors = marimo_app.page, marimo_app.outside, marimo_app.errors
    page.wait_for_selector(".memsim-verdict-word", timeout=60_000)
    page.wait_for_selector(BARS, timeout=60_000)
    page.wait_for_selector(".py-state", timeout=30_000)
    assert page.evaluate(f"() => {SHADOW}?.querySelectorAll('.memsim').length") == 1, "in the shadow root"
    before = _python_state(page)
    assert before["error"] == ""
    assert page.inner_text(".memsim-verdict-word").strip().lower() == before["verdict"]
    assert page.inner_text(".memsim-peak-allocated b") == f"allocated {before['allocated']}"
    verdict0, chart0 = page.evaluate(VERDICT_JS), page.evaluate(CHART_JS, BARS)
    page.screenshot(path=str(ARTIFACTS / "marimo-before.png"), full_page=True)

    # One arrow key on the slider: the next stop up (the default micro-batch is the first stop).
    slider = page.locator(".memsim-ctl-micro_batch_size")
    slider.scroll_into_view_if_needed()
    slider.focus()
    assert page.inner_text(".memsim-ctl-micro_batch_size ~ output") == before["mb"], (
        "the slider shows Python's"
    )
    page.keyboard.press("ArrowRight")
    for js, arg, was in ((VERDICT_JS, None, verdict0), (CHART_JS, BARS, chart0)):
        page.wait_for_function(
            f"([arg, was]) => {{ const now = ({js})(arg); return now && now !== was; }}",
            arg=[arg, was],
            timeout=30_000,
            polling=100,
        )
    # marimo re-ran the cell that reads the widget: Python holds the slider's new micro-batch and its result.
    shown_mb = page.inner_text(".memsim-ctl-micro_batch_size ~ output")
    page.locator(".py-state", has_text=f"mb={shown_mb};").wait_for(timeout=30_000)
    after = _python_state(page)
    assert int(after["mb"]) > int(before["mb"]) and shown_mb == after["mb"], (before, after, shown_mb)
    assert after["error"] == ""
    assert page.inner_text(".memsim-verdict-word").strip().lower() == after["verdict"]
    assert page.inner_text(".memsim-peak-allocated b") == f"allocated {after['allocated']}"
    assert after["allocated"] != before["allocated"], "a larger micro-batch holds more activations"
    page.screenshot(path=str(ARTIFACTS / "marimo-after.png"), full_page=True)
    assert errors == [], f"uncaught page errors: {errors}"
    assert outside == [], f"requests left 127.0.0.1: {outside}"
    elapsed = time.monotonic() - marimo_app.t0
    with (ARTIFACTS / "timing.txt").open("a") as out:
        out.write(f"test_widget_in_marimo_reacts_to_the_micro_batch_slider {elapsed:.1f} s (with setup)\n")
    assert elapsed < 60, f"marimo test took {elapsed:.0f} s"
