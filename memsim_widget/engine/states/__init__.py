"""Model states on one rank: weights, gradients, master copy, optimizer states, and their sharding.

Bytes per parameter per recipe follow docs/memory-facts.md#bytes-per-parameter; ZeRO (Rajbhandari et al. 2020,
arXiv 1910.02054) shards optimizer states over dp at stage 1, gradients too at stage 2, and the
weights at stage 3, where the unit being computed is gathered in full (plus the prefetched next one).
QLoRA storage follows Dettmers et al. 2023 (arXiv 2305.14314): NF4 0.5 B/param plus block absmax.

One module per kind: ``budget`` (``StateBudget``, the rank's ``LocalGroup``s), ``weights`` (plain, NF4, fp8
cache), ``trained`` (what trains: all parameters or the LoRA adapters), ``gradients`` (with DDP and DeepSpeed
buckets), ``optimizer`` (master copy, states, step temporaries), ``gathered`` (ZeRO-3 / FSDP units) and
``assemble`` (``model_states``).
"""

from __future__ import annotations

from memsim_widget.engine.states.assemble import model_states
from memsim_widget.engine.states.budget import LocalGroup, StateBudget, local_groups
from memsim_widget.engine.states.weights import nf4_bytes

__all__ = ["LocalGroup", "StateBudget", "local_groups", "model_states", "nf4_bytes"]
