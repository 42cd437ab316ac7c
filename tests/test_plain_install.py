"""``pip install memsim-widget`` without the ``widget`` extra (issue 25): the engine and the CLI work, and
``MemSim`` says in one line how to install the extra. Each case runs in a fresh interpreter in which the extra's
packages cannot be imported (``sys.modules[name] = None`` makes their import fail as a missing package does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(blocked: str, body: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys\nsys.modules[{blocked!r}] = None\n{body}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("blocked", ["anywidget", "altair", "ipywidgets", "traitlets"])
def test_the_engine_and_cli_work_without_the_widget_extra(blocked: str) -> None:
    run = _run(
        blocked,
        "import memsim_widget\n"
        "print(memsim_widget.estimate(memsim_widget.Scenario()).verdict())\n"
        "from memsim_widget.cli import main\n"
        "sys.exit(main(['estimate', '--json']))\n",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] in ("fits", "tight", "does not fit", "OOM")


@pytest.mark.parametrize("blocked", ["anywidget", "altair", "ipywidgets", "traitlets"])
def test_memsim_without_the_widget_extra_says_how_to_install_it(blocked: str) -> None:
    run = _run(blocked, "from memsim_widget import MemSim\n")
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: MemSim needs the widget extra") and blocked in last
    assert 'pip install "memsim-widget[widget]"' in last
    assert "ModuleNotFoundError" not in run.stderr
