"""Issue 13's engine split: the activation rules and the model states are packages of one module per block or
kind, behind the import paths the rest of the code uses (tests/test_import_graph.py holds their functions to 120
lines); issue 28's: the engine is a few top-level modules and one sub-package per concern."""

from __future__ import annotations

from pathlib import Path


def test_the_packages_keep_their_public_import_paths() -> None:
    from memsim_widget.engine import activations as acts
    from memsim_widget.engine import states
    from memsim_widget.engine.activations.budget import ActivationBudget, Term
    from memsim_widget.engine.activations.dispatch import activations
    from memsim_widget.engine.states.assemble import model_states
    from memsim_widget.engine.states.budget import StateBudget
    from memsim_widget.engine.states.weights import nf4_bytes

    assert (acts.activations, acts.ActivationBudget, acts.Term) == (activations, ActivationBudget, Term)
    assert (states.model_states, states.StateBudget, states.nf4_bytes) == (
        model_states,
        StateBudget,
        nf4_bytes,
    )


#: Issue 28: the engine's top-level modules are the entry point, the result and what every part reads; the rest is
#: one sub-package per concern (memsim_widget/engine/__init__.py and docs/architecture.md say which holds what).
TOP_LEVEL = {"core", "estimate", "context", "items", "frameworks", "arith", "caveats"}
PACKAGES = {"states", "activations", "multimodal", "step", "parallel", "counters", "rl", "speed", "caches"}


def test_the_engine_is_a_few_modules_and_one_package_per_concern() -> None:
    import memsim_widget.engine

    engine = Path(memsim_widget.engine.__file__).parent
    modules = {p.stem for p in engine.glob("*.py")} - {"__init__"}
    assert sorted(modules - TOP_LEVEL) == [], "put a new engine module in the sub-package of its concern"
    assert modules == TOP_LEVEL
    folders = {p.name for p in engine.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == PACKAGES
    assert {p.parent.name for p in engine.glob("*/__init__.py")} == PACKAGES  # no namespace package


def test_the_public_entry_points_stay() -> None:
    """``memsim_widget.estimate`` and ``Estimate`` are the engine's ``core.estimate`` and ``estimate.Estimate``."""
    import memsim_widget
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.estimate import Estimate

    assert (memsim_widget.estimate, memsim_widget.Estimate) == (estimate, Estimate)
