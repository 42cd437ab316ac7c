"""Issue 13's engine split: the activation rules and the model states are packages of one module per block or
kind, behind the import paths the rest of the code uses (tests/test_import_graph.py holds their functions to 120
lines)."""

from __future__ import annotations


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
