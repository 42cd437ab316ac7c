"""The compare panel in a real JupyterLab, driven by headless Chromium, fully offline.

Opens a fresh notebook whose widget shows full fine-tuning of Llama 3.2 1B on an A100 40GB, clicks "Pin",
switches the method control to LoRA, and checks that the page shows the pin, the compare chart's bars for the
pin and the current scenario, and the table row of the differing field (``method``) with the pin's value
highlighted; that Python's comparison says the same; and that removing the pin hides the comparison.
Screenshots go to ``artifacts/browser/`` (git-ignored).
"""

from __future__ import annotations

import json
import time

import pytest
from jlab import (
    ROOT,
    chromium_available,
    chromium_page,
    jupyter_lab,
    kernel_json,
    open_notebook,
    run_all_cells,
)

ARTIFACTS = ROOT / "artifacts" / "browser"
SKIP = chromium_available()
SCENARIO = {"model": "llama-3.2-1b", "gpu": "a100-40gb", "seq_len": 1024}
SOURCE = f"from memsim_widget import MemSim\n\nsim = MemSim(**{SCENARIO!r})\nsim"
#: The compare chart's bars as vega's SVG renderer draws them.
BARS = ".memsim-chart-compare svg .mark-rect path"
METHOD_ROW = "//tr[contains(@class, 'memsim-compare-diff')][th[text()='method']]"


def notebook() -> str:
    """A one-cell notebook (nbformat 4) showing the widget on ``SCENARIO``."""
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": SOURCE}
    return json.dumps(
        {
            "cells": [cell],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
def test_pin_change_a_knob_and_compare_in_jupyterlab() -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    name = f"compare-{int(time.time() * 1000)}.ipynb"
    with (
        jupyter_lab({name: notebook()}) as lab,
        chromium_page(viewport=(1400, 2400)) as (page, outside, errors),
    ):
        open_notebook(page, lab, name)
        assert run_all_cells(page) == []
        page.wait_for_selector(".memsim-verdict-word", timeout=60_000)
        assert page.locator(".memsim-compare-body").is_hidden(), "nothing to compare before a pin"

        # Pin: Python names and estimates the pin; the page lists it.
        pin = page.locator(".memsim-pin")
        pin.scroll_into_view_if_needed()
        pin.click()
        page.wait_for_selector(".memsim-pin-item", timeout=30_000)
        assert page.inner_text(".memsim-pin-item b") == "pin 1"
        assert kernel_json(page, "sim.pin_names") == ["pin 1"]

        # Change a knob: the comparison follows the current scenario; the pin stays.
        page.select_option(".memsim-ctl-method", "lora")
        page.wait_for_selector(f"xpath={METHOD_ROW}", timeout=30_000)
        cells = page.locator(f"xpath={METHOD_ROW}/td")
        assert cells.all_inner_texts() == ["full", "lora"]
        assert cells.nth(0).get_attribute("class") == "memsim-compare-changed"
        assert cells.nth(1).get_attribute("class") in ("", None)
        heads = page.locator(".memsim-compare-table thead th").all_inner_texts()
        assert [h.strip() for h in heads] == ["", "pin 1", "current"]
        page.wait_for_selector(BARS, timeout=30_000)
        labels = page.locator(".memsim-chart-compare svg .mark-text text").all_text_contents()
        axis = page.locator(".memsim-chart-compare svg .role-axis-label text").all_text_contents()
        assert {"pin 1", "current"} <= set(axis), axis
        assert any(t.endswith("GiB") for t in labels), "the bars' totals are labelled"
        py = kernel_json(
            page,
            "{'diff': sim.compare().differences, 'rows': sim.comparison['view']['rows'], 'err': sim.error}",
        )
        assert py["err"] == "" and py["diff"] == {"method": {"pin 1": "full", "current": "lora"}}
        peaks = page.locator(".memsim-compare-peak td").all_inner_texts()
        assert peaks == [r["peak"] for r in py["rows"]]
        page.locator(".memsim-compare").screenshot(path=str(ARTIFACTS / "compare.png"))

        # Remove the pin: the comparison goes away in the page and in Python.
        page.locator(".memsim-unpin").click()
        page.wait_for_selector(".memsim-compare-body", state="hidden", timeout=30_000)
        assert kernel_json(page, "sim.pins") == []
        assert errors == [], f"uncaught page errors: {errors}"
        assert outside == [], f"requests left 127.0.0.1: {outside}"
