"""torchtune's two memory savers on a traced step: activation offloading and the optimizer step in backward.

torchtune 0.6.1 (PyPI) does not import beside this project's torchao (``torchtune.modules`` imports
``torchao.dtypes.nf4tensor``, which torchao 0.13+ moved), and its ``OffloadActivations`` makes CUDA streams in its
constructor; so the same semantics are reproduced here with torch's own primitives, read from
pytorch/torchtune ``torchtune/training/_activation_offloading.py`` and ``torchtune/training/memory.py`` at tag
v0.6.1 (what each piece keeps on the GPU is what decides the peak; the streams only order copies):

- ``OffloadActivations(use_streams=True, max_fwd_stash_size=5, min_offload_size=1024)`` is a
  ``saved_tensors_hooks``: every saved tensor of at least 1024 bytes that is not a ``Parameter`` or ``Buffer`` is
  copied to (pinned) host memory in forward; the GPU original stays referenced in a forward stash until a tensor
  packed five ids later arrives (ids count every packed tensor, small ones too), and whatever is still stashed
  at the start of backward is used in place. In backward a tensor brought back stays in a backward stash until
  the hook of the *next* autograd node that brings one back has run, and the rest is dropped at the end of
  backward. Smaller tensors, parameters and buffers stay on the GPU as saved.
- The copies brought back are made under ``torch.cuda.stream(self.s1)`` (``unpack_tensor_with_streams``): the
  caching allocator takes their blocks from the copy stream's own pool, and a block freed there serves only that
  stream again. Here they carry ``engine/counters/offload_stream.TORCHTUNE_COPY_STREAM`` (``trace/replay.py``
  replays each stream's pool apart). Not reproduced: the ``record_stream(s0)`` torchtune calls when a node's
  output is a view of a tensor it brought back (the block then waits for the compute stream's work).
- ``get_act_offloading_ctx_manager`` wraps the output head in ``NoOpManager`` (its saved tensors stay on the
  GPU), and the recipes compute the loss outside the context: here the head's pre-hook opens a no-op hook that
  stays until the model's forward returns (transformers computes the loss inside ``forward``).
- ``register_optim_in_bwd_hooks``: one optimizer per parameter (``{p: optimizer([p])}``); each parameter's
  post-accumulate-grad hook runs ``step()`` then ``zero_grad()``, so a gradient dies as soon as its step is done.

A host copy is made inside ``MemoryTracker.on_host()``: it counts 0 bytes, as the GPU counter never sees it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from memsim_widget.engine.counters.offload_stream import TORCHTUNE_COPY_STREAM

from .tracker import MemoryTracker

#: torchtune's defaults (``OffloadActivations.__init__``, v0.6.1).
MAX_FWD_STASH_SIZE = 5
MIN_OFFLOAD_SIZE = 1024


class OffloadedActivations(saved_tensors_hooks):
    """torchtune's ``OffloadActivations`` with streams, its stashes kept, its copies made by the tracker: a host
    copy counts 0 bytes, a copy brought back is a new GPU tensor."""

    def __init__(self, tracker: MemoryTracker) -> None:
        """Hooks packing to host copies held by id (``tracker`` makes the host copies 0 bytes)."""
        self.tracker: dict[int, tuple[torch.Tensor, bool]] = {}
        self.fwd_stash: dict[int, torch.Tensor] = {}
        self.bwd_stash: dict[int, torch.Tensor] = {}
        self.tensor_id = 0
        self.first_backward_call = True
        self.graph_id: int | None = None
        self.node: Any = None

        def pack(t: torch.Tensor) -> int:
            self.first_backward_call = True
            self.tensor_id += 1
            tid = self.tensor_id
            offload = t.element_size() * t.nelement() >= MIN_OFFLOAD_SIZE and not isinstance(
                t, torch.nn.Parameter | torch.nn.Buffer
            )
            if not offload:
                self.tracker[tid] = (t, False)
                return tid
            for old in list(self.fwd_stash):  # the copy of ids five back is done: drop the GPU original
                if old <= tid - MAX_FWD_STASH_SIZE:
                    del self.fwd_stash[old]
                else:
                    break
            with tracker.on_host():
                host = torch.empty_like(t)
            self.tracker[tid] = (host, True)
            self.fwd_stash[tid] = t
            return tid

        def unpack(tid: int) -> torch.Tensor:
            if self.first_backward_call:
                self.first_backward_call = False
                self.graph_id = torch._C._current_graph_task_id()
                torch.autograd.Variable._execution_engine.queue_callback(self.bwd_stash.clear)
            t, modified = self.tracker.pop(tid)
            if not modified:
                return t
            node = torch._C._current_autograd_node()
            prev: list[int] = []
            if torch._C._current_graph_task_id() == self.graph_id and self.node is not node:
                self.node = node
                prev = list(self.bwd_stash)
            brought_back = tid not in self.fwd_stash
            if brought_back:  # the copy back to the GPU, made on torchtune's copy stream
                with tracker.role_scope(tracker.scope_role, stream=TORCHTUNE_COPY_STREAM):
                    t = torch.empty_like(t)
                self.bwd_stash[tid] = t
            else:
                t = self.fwd_stash[tid]

            def hook(outputs: Any, _inputs: Any) -> Any:
                self.fwd_stash.clear()  # in backward now: nothing is stashed for forward's copies
                for old in prev:
                    self.bwd_stash.pop(old, None)
                return outputs

            node.register_hook(hook)
            return t

        super().__init__(pack, unpack)


class _NoOp(saved_tensors_hooks):
    """torchtune's ``NoOpManager``: the innermost hooks, saving tensors as they are."""

    def __init__(self) -> None:
        """Identity pack and unpack."""
        super().__init__(lambda t: t, lambda t: t)


@contextlib.contextmanager
def offloaded_forward(tracker: MemoryTracker, head: torch.nn.Module | None) -> Iterator[None]:
    """The forward under torchtune's offloading context, the output head and what follows it (the loss) not
    offloaded (``get_act_offloading_ctx_manager``)."""
    noop = _NoOp()
    entered: list[bool] = []

    def _head(*_args: Any) -> None:
        if not entered:
            noop.__enter__()
            entered.append(True)

    handle = head.register_forward_pre_hook(_head) if head is not None else None
    try:
        with OffloadedActivations(tracker):
            try:
                yield
            finally:
                if entered:
                    noop.__exit__(None, None, None)
    finally:
        if handle is not None:
            handle.remove()


class OptimizerInBackward:
    """torchtune's optimizer step in backward: one optimizer per trainable parameter, stepped and zeroed by the
    parameter's post-accumulate-grad hook (``register_optim_in_bwd_hooks``); ``step`` and ``zero_grad`` of the
    training loop do nothing (torchtune's recipe skips them)."""

    def __init__(self, params: list[torch.nn.Parameter], make: Callable[[list[Any]], torch.optim.Optimizer]):
        """Per-parameter optimizers from ``make([p])`` and their hooks."""
        self.optimizers = {p: make([p]) for p in params}
        self.handles = [p.register_post_accumulate_grad_hook(self._step) for p in params]

    def _step(self, p: torch.nn.Parameter) -> None:
        opt = self.optimizers[p]
        opt.step()
        opt.zero_grad(set_to_none=True)

    @property
    def state(self) -> dict[Any, Any]:
        """Every parameter's optimizer state."""
        return {k: v for opt in self.optimizers.values() for k, v in opt.state.items()}

    def step(self) -> None:
        """Nothing: each parameter stepped in backward."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: each gradient was dropped after its step."""

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self.handles:
            h.remove()
