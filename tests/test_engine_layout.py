"""Issue 13's engine split: the activation rules and the model states are packages of small modules behind the
import paths the rest of the code uses, and none of their functions is over 120 lines (nested functions count
within their parent)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "memsim_widget" / "engine"
#: The longest function the split engine modules may have (issue 13's target).
MAX_FUNCTION_LINES = 120
SPLIT = [
    *sorted((ENGINE / "activations").glob("*.py")),
    *sorted((ENGINE / "states").glob("*.py")),
    ENGINE / "vision.py",
]


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (n lines)`` for each function in ``path`` longer than ``limit`` lines, nested ones included."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


@pytest.mark.parametrize("path", SPLIT, ids=lambda p: str(p.relative_to(ENGINE)))
def test_no_function_of_the_split_engine_is_over_120_lines(path: Path) -> None:
    assert long_functions(path) == []


def test_the_length_check_counts_nested_functions(tmp_path: Path) -> None:
    """A check of the check: a short function holding a long nested one is long."""
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src = tmp_path / "m.py"
    src.write_text(f"def outer():\n    def inner():\n{body}\n    return inner\n", encoding="utf-8")
    assert long_functions(src) == [
        f"outer ({MAX_FUNCTION_LINES + 3} lines)",
        f"inner ({MAX_FUNCTION_LINES + 1} lines)",
    ]


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
