"""The widget's own dependencies (the ``widget`` extra), checked before anything imports them.

``pip install memsim-widget`` gives the engine and the CLI (numpy, pandas); ``MemSim`` needs the ``widget`` extra.
Without it, importing the widget fails with one line that says how to install it, not with a
``ModuleNotFoundError`` from deep inside a module.
"""

from __future__ import annotations

import importlib

#: The packages of the ``widget`` extra that importing the widget needs (pyproject.toml ``widget``).
WIDGET_EXTRA = ("anywidget", "traitlets", "ipywidgets", "altair")
INSTALL = 'pip install "memsim-widget[widget]"'

for _name in WIDGET_EXTRA:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as _exc:  # the package itself, or one it needs (anywidget needs traitlets)
        _missing = (_exc.name or _name).split(".")[0]
        raise ImportError(f"MemSim needs the widget extra ({_missing} is not installed): {INSTALL}") from None
