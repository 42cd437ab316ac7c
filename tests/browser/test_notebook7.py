"""The widget in Jupyter Notebook 7 (not JupyterLab), driven by headless Chromium, fully offline.

Starts ``jupyter notebook`` on 127.0.0.1 with a token on a free port and private Jupyter folders, opens a
fresh one-cell notebook that shows ``MemSim()`` (the default scenario, charts on), runs it, waits for the
verdict and the drawn breakdown chart, moves the micro-batch slider one stop with the keyboard and checks
that Python received the new value and that the page's verdict, peak and chart are redrawn from Python's new
result; no page error, no request leaving 127.0.0.1. Screenshots go to ``artifacts/browser/`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from jlab import (
    KERNEL_READY_JS,
    LAB_SETTINGS,
    ROOT,
    Lab,
    chromium_available,
    chromium_page,
    free_port,
    kernel_json,
    run_all_cells,
    stop,
    wait_for_status,
)

ARTIFACTS = ROOT / "artifacts" / "browser"


def _skip_reason() -> str | None:
    reason = chromium_available()
    if reason is not None:
        return reason
    try:
        import notebook  # noqa: F401
    except ImportError:
        return "the notebook package (Jupyter Notebook 7) is not installed"
    return None


SKIP = _skip_reason()
SOURCE = "from memsim_widget import MemSim\n\nsim = MemSim()\nsim"
BARS = ".memsim-chart-breakdown svg .mark-rect path"
CHART_JS = """(sel) => [...document.querySelectorAll(sel)].map((p) => p.getAttribute('d')).join('|')"""
#: Kernel helper: the allocated peak's text (nvidia-smi's total can sit at the card's size for both batches).
ALLOCATED = (
    "_alloc = lambda s: next(p['size'] for p in s.result['peaks'] if p['key'] == 'peak_allocated_bytes')"
)
#: Notebook 7.6.5 itself throws this once while the page loads, before any cell runs: its shortcuts plugin's
#: ``pluginChanged`` handler reads ``plugins['@jupyterlab/shortcuts-extension:shortcuts'].schema`` when the
#: document manager's settings load, before the shortcuts plugin's own settings are there (upstream, in
#: ``static/notebook/notebook_core.*.js``; it happens with an empty notebook and no widget too).
UPSTREAM_ERROR = "Cannot read properties of undefined (reading 'schema')"


def _ours(stack: str) -> bool:
    """Whether a page error is not Notebook 7's known load-time error."""
    first_frame = next((line for line in stack.splitlines() if line.strip().startswith("at ")), "")
    return not (
        stack.startswith(f"TypeError: {UPSTREAM_ERROR}") and "/static/notebook/notebook_core." in first_frame
    )


VERDICT_JS = "() => document.querySelector('.memsim-verdict')?.innerText ?? ''"


def notebook() -> str:
    """A one-cell notebook (nbformat 4) showing the default widget."""
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": SOURCE}
    return json.dumps(
        {
            "cells": [cell],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


@contextmanager
def jupyter_notebook(name: str, text: str) -> Iterator[Lab]:
    """``jupyter notebook`` (Notebook 7) serving one notebook from a temporary folder, stopped on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="memsim-nb7-"))
    root = tmp / "root"
    root.mkdir()
    (root / name).write_text(text, encoding="utf-8")
    settings = tmp / "settings"
    for rel, value in LAB_SETTINGS.items():  # the same news/update notification settings as JupyterLab
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value), encoding="utf-8")
    env = {
        **os.environ,
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "PYTHONUNBUFFERED": "1",
    }
    port, token = free_port(), os.urandom(12).hex()
    log = tmp / "notebook.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "notebook",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--JupyterNotebookApp.expose_app_in_browser=True",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Lab(root, port, token, proc, log)
    try:
        try:
            wait_for_status(server.base, token, proc)
        except Exception as exc:
            raise RuntimeError(f"{exc}\n--- jupyter notebook log ---\n{server.log_tail()}") from exc
        yield server
    finally:
        stop(proc)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, ARTIFACTS / "notebook7.log")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def nb7() -> Iterator[SimpleNamespace]:
    """Notebook 7 with the one-cell notebook open in Chromium and run: ``server``, ``page``, ``outside``, ``errors``."""
    if SKIP is not None:
        pytest.skip(SKIP)
    t0 = time.monotonic()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    name = f"nb7-{int(time.time() * 1000)}.ipynb"
    with jupyter_notebook(name, notebook()) as server, chromium_page() as (page, outside, _):
        errors: list[str] = []  # with their stacks, to tell Notebook 7's own load-time error apart
        page.on("pageerror", lambda exc: errors.append(exc.stack or f"{exc.name}: {exc.message}"))
        page.goto(f"{server.base}/notebooks/{name}?token={server.token}")
        # Notebook 7 is built from JupyterLab: the same app API tells when the kernel is connected.
        page.wait_for_function(KERNEL_READY_JS, timeout=120_000, polling=200)
        # The page is Notebook 7's single-document app, not JupyterLab.
        assert page.evaluate("window.jupyterapp.name") == "Jupyter Notebook"
        assert server.api("/api/kernels")[0]["connections"] > 0
        cell_errors = run_all_cells(page)
        assert cell_errors == [], f"cells raised: {cell_errors}"
        yield SimpleNamespace(server=server, page=page, outside=outside, errors=errors, t0=t0)


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
def test_widget_in_notebook7_reacts_to_the_micro_batch_slider(nb7: SimpleNamespace) -> None:
    page, outside, errors = nb7.page, nb7.outside, nb7.errors
    page.wait_for_selector(".memsim-verdict-word", timeout=60_000)
    page.wait_for_selector(BARS, timeout=60_000)
    assert page.locator(".memsim").count() == 1
    state = kernel_json(
        page,
        "{'mb': sim.scenario.micro_batch_size, 'stops': sim.options['stops']['micro_batch_size'],"
        " 'verdict': sim.result['verdict'], 'peak': sim.result['peaks'][0]['size'], 'allocated': _alloc(sim)}",
        ALLOCATED,
    )
    assert page.inner_text(".memsim-verdict-word").strip().lower() == state["verdict"]
    assert state["peak"] in page.inner_text(".memsim-verdict-peak")
    assert page.inner_text(".memsim-peak-allocated b") == f"allocated {state['allocated']}"
    verdict0, chart0 = page.evaluate(VERDICT_JS), page.evaluate(CHART_JS, BARS)
    page.locator(".memsim").screenshot(path=str(ARTIFACTS / "notebook7-widget-before.png"))

    # One arrow key on the slider: the next stop up (or down, at the last stop).
    stops, i = state["stops"], state["stops"].index(state["mb"])
    key, want_mb = ("ArrowRight", stops[i + 1]) if i + 1 < len(stops) else ("ArrowLeft", stops[i - 1])
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

    # Python holds the new micro-batch, and the page shows Python's result for it.
    after = kernel_json(
        page,
        "{'mb': sim.scenario.micro_batch_size, 'error': sim.error, 'verdict': sim.result['verdict'],"
        " 'peak': sim.result['peaks'][0]['size'], 'allocated': _alloc(sim)}",
        ALLOCATED,
    )
    assert (after["mb"], after["error"]) == (want_mb, "")
    assert page.inner_text(".memsim-ctl-micro_batch_size ~ output") == str(want_mb)
    assert page.inner_text(".memsim-verdict-word").strip().lower() == after["verdict"]
    assert after["peak"] in page.inner_text(".memsim-verdict-peak")
    assert page.inner_text(".memsim-peak-allocated b") == f"allocated {after['allocated']}"
    # A larger (or smaller) micro-batch holds more (or fewer) activations: the allocated peak moves.
    assert after["allocated"] != state["allocated"]
    # The key moved the slider, not the notebook (no cell added, moved or run by a shortcut).
    assert page.evaluate("window.__memsimPanel.content.widgets.length") == 1
    page.locator(".memsim").screenshot(path=str(ARTIFACTS / "notebook7-widget-after.png"))
    unexpected = [e for e in errors if _ours(e)]
    assert unexpected == [], f"uncaught page errors: {unexpected}"
    assert outside == [], f"requests left 127.0.0.1: {outside}"
    elapsed = time.monotonic() - nb7.t0
    with (ARTIFACTS / "timing.txt").open("a") as out:
        out.write(f"test_widget_in_notebook7_reacts_to_the_micro_batch_slider {elapsed:.1f} s (with setup)\n")
    assert elapsed < 90, f"Notebook 7 test took {elapsed:.0f} s"
