"""The zero gradients AOTAutograd makes at the top of a compiled backward, named once.

A ``torch.compile``d model returns outputs the loss does not use (HF's logits beside the loss, and the KV cache it
returns in training); AOTAutograd's compiled backward takes a gradient for every output, so it materialises zeros
for them before the backward graph runs (traced: trace/compiled.py, docs/fidelity.md). The compiled rules
(``compiled.py``, ``compiled_layernorm.py``) name their terms with these words, and the allocation stream
(``engine/counters/alloc_stream``) reads the top of a compiled backward by them: the KV cache's zero gradients
first, then the logits', then the loss's own gradient buffer, as the traces order them.

The loss's own gradient buffer (``LOSS_GRADIENT``: nll_loss's backward, fp32 zeros scattered at the labels) is in
the default compiled trace and the allocated rules, but Inductor never allocates it (torch 2.13.0 source):
``torch/_inductor/compile_fx.py`` ``partition_fn``, which ``compile_fx`` hands AOTAutograd, runs
``_recursive_joint_graph_passes`` on the joint graph before the min-cut partitioner, and among them
``fx_passes/joint_graph.py`` ``scatter_upon_const_tensor`` (``config.optimize_scatter_upon_const_tensor``, on by
default) rewrites ``scatter(full(...), dim, index, value)`` with a one-wide index into ``where(iota == index, value,
fill)``, a pointwise op the log-softmax backward's kernel computes inline. That kernel also reads the saved logits
and the logits' zero gradient, so both live until the logits' gradient is written: Inductor frees a buffer after
the kernel of its last use (``codegen/wrapper.py`` ``codegen_free``; a graph input, as the zero gradient is, is
freed there and never reused in place: ``can_reuse``; the saved logits are also the user's output, so AOTAutograd
does not donate them to the backward, ``_aot_autograd/graph_compile.py`` ``collect_fw_donated_buffer_idxs``, so
the gradient cannot be written into them either).
The allocation stream follows this (``alloc_stream.compiled_loss_backward``); traced by
``trace/compiled.inductor_passes`` (docs/allocator.md, "Compiled steps").
"""

from __future__ import annotations

#: In the name of the logits' zero gradient (``e B x T x V``).
LOGITS_TANGENT = "unused logits output"
#: In the name of the returned KV cache's zero gradients (one tensor per layer's k and v).
CACHE_TANGENTS = "returned KV cache"
#: In the name of the loss's own T x V gradient buffer that Inductor fuses away (module docstring).
LOSS_GRADIENT = "nll_loss's T x V gradient buffer"


def tangent_role(name: str) -> str:
    """What a compiled loss-backward term named ``name`` is: one of AOTAutograd's zero gradients (``LOGITS_TANGENT``,
    ``CACHE_TANGENTS``), nll_loss's buffer Inductor fuses away (``LOSS_GRADIENT``), or '' (another buffer)."""
    return next((role for role in (LOGITS_TANGENT, CACHE_TANGENTS, LOSS_GRADIENT) if role in name), "")
