"""What a DeepSpeed ZeRO-3 rank holds gathered at the moments the engine's items count (``states/gathered``):
read off the coordinator that writes the rank's allocation stream (``zero3_stream.Zero3Writer``, the offloaded
one under ``offload_optimizer`` gathers alike), so that the items and the stream count the same parameters.

deepspeed 0.19.8 ``runtime/zero/partitioned_param_coordinator.py`` (``release_sub_module``,
``__params_to_release``: after a module's forward its gathered parameters are freed unless the recorded trace uses
them again within ``stage3_max_reuse_distance`` elements; ``fetch_sub_module``'s prefetch of the next parameters,
up to ``stage3_prefetch_bucket_size``, in one coalesced all-gather) and ``runtime/zero/parameter_offload.py``
(``_post_forward_module_hook`` releases, ``_pre_backward_module_hook`` fetches again): at the loss of a step whose
trace is recorded (the second forward on) what is gathered is the parameters kept for their reuse (with a real
vocabulary the head's, its backward next; the embeddings, used again only at the bottom of backward, are freed
after their forward), the persistent ones (``stage3_param_persistence_threshold``), and the prefetch the head's
fetch started (the last layer's first parameters, still in their coalesced buffer). Each gathered parameter is a
whole buffer beside its partition (``_all_gather_sequential``'s ``ceil(numel / dp) x dp`` elements, or its copy
out of the coalesced buffer). Restated, nothing copied; held to the recorded CPU traces through the stream
(tests/engine/test_zero3_stream.py).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from memsim_widget.engine.counters.allocator import FREE
from memsim_widget.fast_dataclass import dataclass


class _Bare:
    """The calls of ``alloc_stream.StreamWriter`` a ``Zero3Writer`` makes, on a bare list of events (no
    activation: ``items`` makes none); the states read this module, so it stands on neither the stream's writer
    nor the states it reads."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int, int]] = []
        self.handle = 0

    def alloc(self, size: int, n: int = 1, stream: int = 0) -> list[int]:
        """``n`` allocations of ``size`` bytes; their handles."""
        out = list(range(self.handle + 1, self.handle + n + 1))
        self.events += [(h, size, stream) for h in out]
        self.handle += n
        return out

    def free(self, handles: Any) -> None:
        """Free ``handles`` in order."""
        self.events += [(h, FREE, 0) for h in handles]

    def items(self, items: Any) -> list[int]:
        """No activation is written here."""
        return []


@dataclass(frozen=True)
class Zero3Gathered:
    """Bytes (and tensors) of the gathered parameters of a ZeRO-3 rank in its steady state (the coordinator's
    trace recorded): at the loss (the end of forward, the loss's forward and backward), and the most at once over
    the backward (from the head's pre-backward fetch to the bottom's release)."""

    at_loss: int
    at_loss_tensors: int
    in_backward: int
    in_backward_tensors: int


def _gathered(w: Any, size: dict[Any, int]) -> tuple[int, int]:
    """Bytes and tensors the writer ``w`` holds gathered now: the parameters' buffers and coalesced buffers still
    in flight."""
    hs = [h for hs in w.data.values() for h in hs] + [h for flat, _, _ in w.flats.values() for h in flat]
    return sum(size[h] for h in hs), len(hs)


@lru_cache(maxsize=256)
def zero3_gathered(u: Any) -> Zero3Gathered:
    """The gathered bytes of the ZeRO-3 rank of units ``u`` (``zero3_stream.Zero3Units`` or ``zero_lora``'s; an
    offloaded rank's coordinator is the same): its writer run on a bare stream through the wrap and a step whose
    trace is recorded (the first forward's reset counted, whose step leaves gathered only what the wrap left:
    every release of a recording step frees), its forward and backward, no activation written; checkpointed
    layers' recomputes as ``u`` says."""
    from memsim_widget.engine.counters.zero3_stream import Zero3Writer

    s = _Bare()
    w = Zero3Writer(s, u)
    size: dict[Any, int] = {}
    w.wrap()
    none: dict[str, Any] = {"top_backward": (), "recompute": (), "layer_backward": ()}
    seen: list[tuple[int, int]] = []
    fetch = w._fetch
    read = [0]  # the events whose sizes ``size`` holds

    def sizes() -> None:
        size.update((h, n) for h, n, _ in s.events[read[0] :] if n != FREE)
        read[0] = len(s.events)

    def watched(unit: int | None) -> None:  # the most held at once in backward: right after a fetch
        fetch(unit)
        sizes()
        seen.append(_gathered(w, size))

    w._reset()  # the recording forward's
    w.forward_start()
    for _ in range(u.layers):
        w.layer_forward_start()
        w.layer_forward_end()
    s.alloc(0)  # the logits, which the head's post-forward comes after
    w.forward_end()
    sizes()
    at_loss = _gathered(w, size)
    w._fetch = watched
    w.backward_start(u.layers)
    w.backward(none, [[] for _ in range(u.layers)], [])
    top = max(seen, default=(0, 0))
    return Zero3Gathered(at_loss[0], at_loss[1], top[0], top[1])
