"""One rank of an N-GPU job in this process: a fake process group and a CPU device mesh, always torn down.

PyTorch's own fake backend (``torch.testing._internal.distributed.fake_pg``) makes every collective a no-op
with correctly shaped outputs, so FSDP2, DTensor and pipelining run their real code for one rank
(docs/memory-facts.md#tracing-one-rank-on-a-cpu). The mesh is built outside FakeTensorMode; pitfall (8): fake
CUDA devices do not
work on a CPU build, so the mesh is on ``cpu``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from memsim_widget.errors import ScenarioError


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """Initialise the fake default process group as ``rank`` of ``world_size``; destroy it on exit.

    Refuses to run inside another process group (a real job, or a trace that did not clean up), so a trace
    never changes a process group it did not create.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not 0 <= rank < world_size:
        raise ScenarioError("rank", f"must be in 0..{world_size - 1} for {world_size} GPUs, got {rank}")
    if dist.is_initialized():
        raise ScenarioError("trace", "a process group is already initialised in this process")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def cpu_mesh(shape: dict[str, int]) -> Any:
    """A CPU ``DeviceMesh`` over the named dimensions of size > 1 (call inside ``fake_world``, outside
    FakeTensorMode); None when every dimension is 1."""
    from torch.distributed.device_mesh import init_device_mesh

    dims = {k: v for k, v in shape.items() if v > 1}
    if not dims:
        return None
    return init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims))


def mesh_coords(rank: int, shape: dict[str, int]) -> dict[str, int]:
    """The coordinates of ``rank`` in a row-major mesh of ``shape`` (the last dimension varies fastest)."""
    out: dict[str, int] = {}
    rest = rank
    sizes = list(shape.items())
    for i, (name, _size) in enumerate(sizes):
        inner = math.prod(s for _, s in sizes[i + 1 :])
        out[name] = rest // inner
        rest %= inner
    return out
