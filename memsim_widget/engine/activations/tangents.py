"""The zero gradients AOTAutograd makes at the top of a compiled backward, named once.

A ``torch.compile``d model returns outputs the loss does not use (HF's logits beside the loss, and the KV cache it
returns in training); AOTAutograd's compiled backward takes a gradient for every output, so it materialises zeros
for them before the backward graph runs (traced: trace/compiled.py, docs/fidelity.md). The compiled rules
(``compiled.py``, ``compiled_layernorm.py``) name their terms with these words, and the allocation stream
(``engine/counters/alloc_stream``) reads the top of a compiled backward by them: the KV cache's zero gradients
first, then the logits', then the loss's own gradient buffer, as the traces order them.
"""

from __future__ import annotations

#: In the name of the logits' zero gradient (``e B x T x V``).
LOGITS_TANGENT = "unused logits output"
#: In the name of the returned KV cache's zero gradients (one tensor per layer's k and v).
CACHE_TANGENTS = "returned KV cache"


def tangent_role(name: str) -> str:
    """Which of AOTAutograd's zero gradients a compiled loss-backward term named ``name`` is: ``LOGITS_TANGENT``,
    ``CACHE_TANGENTS``, or '' (the loss's own gradient buffer)."""
    return next((role for role in (LOGITS_TANGENT, CACHE_TANGENTS) if role in name), "")
