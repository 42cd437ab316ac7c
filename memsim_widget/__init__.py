"""memsim-widget: simulate the GPU memory of training and fine-tuning deep-learning models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memsim_widget.errors import ScenarioError
from memsim_widget.version import __version__ as __version__

if TYPE_CHECKING:
    from memsim_widget.comparison import Comparison, compare
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.estimate import Estimate
    from memsim_widget.importers import import_config
    from memsim_widget.scenario import Scenario
    from memsim_widget.widget import MemSim

__all__ = [
    "Comparison",
    "Estimate",
    "MemSim",
    "Scenario",
    "ScenarioError",
    "compare",
    "estimate",
    "import_config",
]


def __getattr__(name: str) -> Any:
    """Import the widget (and ``compare``, ``import_config``) lazily so the engine and CLI never load Jupyter or
    Altair, and the engine on first use, so that ``memsim --help`` (``python -m memsim_widget.cli``) does not
    load it."""
    if name == "estimate":
        from memsim_widget.engine.core import estimate

        return estimate
    if name == "Estimate":
        from memsim_widget.engine.estimate import Estimate

        return Estimate
    if name == "Scenario":
        from memsim_widget.scenario import Scenario

        return Scenario
    if name == "MemSim":
        from memsim_widget.widget import MemSim  # says how to install the widget extra when it is missing

        return MemSim
    if name == "import_config":  # your launch configs as a scenario, and the settings they leave unread
        from memsim_widget.importers import import_config

        return import_config
    if name in ("compare", "Comparison"):
        from memsim_widget import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module 'memsim_widget' has no attribute {name!r}")
