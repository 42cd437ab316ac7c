"""The torch-side recipe accepts exactly what the torch-free traceability check lets through."""

import pytest

pytest.importorskip("torch")


def test_the_builders_accept_what_check_traceable_lets_through() -> None:
    from memsim_widget.optimizers import OPTIMIZER_IMPLS
    from memsim_widget.trace import torch_recipe, traceable

    assert torch_recipe.PRECISIONS == traceable.TRACEABLE_PRECISIONS
    assert torch_recipe.OPTIMIZERS == traceable.TRACEABLE_OPTIMIZERS
    assert torch_recipe.OPTIMIZER_IMPLS is OPTIMIZER_IMPLS
