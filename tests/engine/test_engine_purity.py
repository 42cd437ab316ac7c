"""The engine is pure Python: the CLI, widget, planner and tests share it without Jupyter, Altair or torch."""

from __future__ import annotations

import subprocess
import sys


def test_engine_and_cli_import_no_heavy_packages():
    code = (
        "import sys\n"
        "import memsim_widget, memsim_widget.engine.core, memsim_widget.cli, memsim_widget.engine.estimate\n"
        "from memsim_widget.engine.core import estimate\n"
        "from memsim_widget.scenario import Scenario\n"
        "estimate(Scenario(model='llama-3.1-8b'))\n"
        "heavy = {'torch', 'transformers', 'altair', 'ipywidgets', 'anywidget', 'IPython', 'pandas', 'numpy'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
