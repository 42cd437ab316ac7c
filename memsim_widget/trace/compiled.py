"""A ``torch.compile`` training step on fake tensors: Dynamo and AOTAutograd with Inductor's decompositions and
its default partitioner (``min_cut_rematerialization_partition``, which reads
``torch._functorch.config.activation_memory_budget``), the partitioned graphs run node by node under the tracker.

What is exact: the graphs Dynamo captures, the tensors the partitioner saves for backward (the forward graph's
extra outputs), and when the backward frees them (the graph takes its inputs boxed, as Inductor's code does, and
drops each after its last use). What is emulated: Inductor's fusion. A node whose op is pointwise, a view or a
reduction, is not a graph output and feeds only such nodes is computed inside a fused kernel and never gets a
buffer; the tracker counts it as 0 bytes (``MemoryTracker.fused``). Every other node (matmuls, attention,
embedding, scatter, any op Inductor calls as an extern kernel, and what they read) gets its buffer; ``gather`` is a
loop too (Inductor's lowering inlines what it reads). Inductor's own scheduler can still realise a pointwise buffer
that several kernels read or inline one the emulation keeps; the trace is labelled with the emulation
(docs/fidelity.md). ``inductor_passes`` traces two more things Inductor's code does, as an experiment
(docs/allocator.md, "Compiled steps"). The compiler runs inside the tracker's pause
(``ignore_compile_internals``); the graphs run with it on.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, cast

import torch
import torch.fx
import torch.fx.node

#: Ops Inductor lowers to loops it can fuse (besides every op tagged pointwise and every view): reductions.
_REDUCTIONS = frozenset(
    {
        "sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "prod", "any", "all", "argmax", "argmin",
        "logsumexp",
    }
)  # fmt: skip


def _op_name(node: torch.fx.Node) -> str:
    t = node.target
    packet = getattr(t, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(t, "__name__", str(t))


#: Ops whose output aliases their input's storage (a fused base they view must stay a buffer when they need one).
_VIEWS = frozenset(
    {
        "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "squeeze", "unsqueeze", "slice",
        "select", "alias", "as_strided", "unfold", "diagonal", "split", "split_with_sizes", "unbind", "chunk",
        "narrow", "view_as_real", "view_as_complex", "unflatten", "flatten",
    }
)  # fmt: skip
#: Ops Inductor lowers to fusible loops besides those tagged pointwise: copies, casts and constants, and ``gather``
#: (``torch/_inductor/lowering.py`` ``gather``, torch 2.13.0: a ``Pointwise`` whose load of its input is indexed by
#: the index tensor, so a pointwise chain it reads is inlined: the fp32 log-softmax that nll_loss gathers the
#: labels' entries from gets no T x V buffer).
_LOOPS = frozenset(
    {
        "clone", "_to_copy", "convert_element_type", "where", "full", "scalar_tensor", "iota", "arange",
        "zeros_like", "ones_like", "full_like", "empty_like", "cat", "constant_pad_nd", "copy", "lift_fresh_copy",
        "gather",
    }
)  # fmt: skip


#: Constant fills, and the ops that write into a buffer at indices (see ``fused_nodes``).
_FILLS = frozenset({"full", "zeros", "new_zeros", "full_like", "zeros_like", "new_full"})
_SCATTERS = frozenset(
    {"scatter", "scatter_add", "index_put", "scatter_reduce", "index_add", "_unsafe_index_put",
     "_unsafe_masked_index_put_accumulate"}
)  # fmt: skip


def _fusible(node: torch.fx.Node) -> bool:
    """A node Inductor computes inside a fused loop: a pointwise op, a view, a reduction, a copy or cast."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return all(_fusible(a) for a in node.all_input_nodes)
    if torch.Tag.pointwise in getattr(node.target, "tags", ()):
        return True
    return _op_name(node) in _VIEWS | _REDUCTIONS | _LOOPS


def fused_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes of ``gm`` that never get a buffer under Inductor (see the module docstring): fusible, not a
    reduction (its output is small and Inductor keeps it), not a graph output, every user fusible, and no view of
    it needing a buffer itself."""
    out_node = next(iter(gm.graph.find_nodes(op="output")))
    outputs: set[torch.fx.Node] = set()
    torch.fx.node.map_arg(out_node.args, outputs.add)
    needs: set[torch.fx.Node] = set()
    for node in reversed(list(gm.graph.nodes)):
        if node.op in ("placeholder", "output"):
            continue
        if (
            node in outputs
            or not _fusible(node)
            or _op_name(node) in _REDUCTIONS
            or any(not _fusible(u) or (_op_name(u) in _VIEWS and u in needs) for u in node.users)
        ):
            needs.add(node)
    # a fresh constant buffer that one scatter writes into: Inductor's functional scatter fills it and scatters in
    # place (one buffer: the scatter's output), e.g. nll_loss_backward's zeros
    for node in gm.graph.nodes:
        if (
            _op_name(node) in _FILLS
            and len(node.users) == 1
            and next(iter(node.users)).args[:1] == (node,)
            and _op_name(next(iter(node.users))) in _SCATTERS
            and node not in outputs
        ):
            needs.discard(node)
    return {n for n in gm.graph.nodes if n.op == "call_function" and n not in needs and n.users}


def kernel_last_uses(
    gm: torch.fx.GraphModule, fused: set[torch.fx.Node]
) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Each node of ``gm`` -> the values to free after it runs, a value living until the last node that reads it
    directly or through fused nodes: a fused chain is computed by the kernel of the node that consumes it, which reads
    the chain's inputs then (``torch.fx.Interpreter``'s own map frees them after the fused node, earlier)."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    readers: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    for n in reversed(nodes):
        readers[n] = set(n.users).union(*(readers[u] for u in n.users if u in fused))
    out: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in nodes:
        if n.op != "output" and readers[n]:
            out.setdefault(max(readers[n], key=order.__getitem__), []).append(n)
    return out


class _FusingInterpreter(torch.fx.Interpreter):
    """Runs a partitioned graph node by node, telling the tracker which outputs live inside a fused kernel
    (``kernel_lifetimes``: each value freed as ``kernel_last_uses`` says)."""

    def __init__(
        self, gm: torch.fx.GraphModule, fused: set[torch.fx.Node], kernel_lifetimes: bool = False
    ) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self._fused = fused
        if kernel_lifetimes:
            self.user_to_last_uses = kernel_last_uses(gm, fused)

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_function" and n.target in _rng_hops():
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            return _run_rng_hop(n.target, args, kwargs)
        tracker = current_tracker()
        if tracker is None or n not in self._fused:
            return super().run_node(n)
        with tracker.fused():
            return super().run_node(n)


@functools.cache
def _rng_hops() -> tuple[Any, Any]:
    """The higher-order ops AOTAutograd wraps a random op in when checkpointing recomputes it (the forward saves
    the generator's state, the recomputation replays it)."""
    hop = torch.ops.higher_order
    return (hop.run_and_save_rng_state, hop.run_with_rng_state)


def _run_rng_hop(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the random op inside the higher-order op, its generator state a 16-byte tensor (CUDA's Philox seed and
    offset) instead of the CPU generator's real state, which the fake mode refuses; the values do not matter to a
    memory trace, the tensors the op makes do."""
    save, _replay = _rng_hops()
    if target is save:
        op, *rest = args
        return torch.empty(16, dtype=torch.uint8), op(*rest, **kwargs)
    _state, op, *rest = args
    return op(*rest, **kwargs)


def current_tracker() -> Any:
    """The innermost MemoryTracker on the dispatch-mode stack (None outside a trace)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from .tracker import MemoryTracker

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, MemoryTracker):
            return mode
    return None


def _boxed_runner(
    gm: torch.fx.GraphModule, _example_inputs: list[torch.Tensor], kernel_lifetimes: bool = False
) -> Callable[..., Any]:
    """The "compiler" of one partitioned graph: a boxed function (it clears its argument list, so each saved
    tensor is freed after its last use in the backward, as Inductor's wrapper code does)."""
    fused = fused_nodes(gm)

    def run(args: list[Any]) -> Any:
        return _FusingInterpreter(gm, fused, kernel_lifetimes).boxed_run(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


#: Set by :func:`inductor_passes` for the compiled traces made inside it.
_INDUCTOR_PASSES: ContextVar[bool] = ContextVar("inductor_passes", default=False)


@contextlib.contextmanager
def inductor_passes() -> Iterator[None]:
    """Compiled steps traced inside the block follow two more things Inductor's own code does (an experiment, not
    the default: the engine's compiled rules are held to the default trace; docs/allocator.md gives both against
    the H200 runs): the partitioner is Inductor's ``partition_fn`` (``torch/_inductor/compile_fx.py``, torch
    2.13.0), which first runs its joint-graph passes (``fx_passes/joint_graph.py``: among them
    ``scatter_upon_const_tensor`` turns nll_loss's backward, zeros scattered at the labels, into a pointwise
    ``where``, so the loss's fp32 T x V gradient buffer is fused away), and each fused chain's inputs stay alive
    until the kernel that computes the chain runs (``kernel_last_uses``)."""
    token = _INDUCTOR_PASSES.set(True)
    try:
        yield
    finally:
        _INDUCTOR_PASSES.reset(token)


def compile_backend(memory_budget: float | None = None, inductor: bool = False) -> Callable[..., Any]:
    """The Dynamo backend: AOTAutograd with Inductor's decompositions and min-cut partitioner, each partitioned
    graph run by ``_boxed_runner``; ``memory_budget`` sets ``activation_memory_budget`` (1.0: the default);
    ``inductor``: Inductor's partition function and kernel lifetimes (:func:`inductor_passes`)."""
    from importlib import import_module

    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    partition: Callable[..., Any] = functools.partial(
        min_cut_rematerialization_partition, compiler="inductor"
    )
    if inductor:
        partition = import_module("torch._inductor.compile_fx").partition_fn
    runner = functools.partial(_boxed_runner, kernel_lifetimes=inductor)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        from .cuda_autocast import cuda_fp32_ops_when_autocast

        patches: dict[str, Any] = {"unlift_effect_tokens": True}
        if memory_budget is not None:
            patches["activation_memory_budget"] = memory_budget
        # AOTAutograd traces the graph here: under autocast with CUDA's fp32 ops, as the eager trace runs them
        with (
            functorch_config.patch(patches),
            cuda_fp32_ops_when_autocast(),
            _inductor_fake_mode(inductor, example_inputs),
        ):
            return aot_autograd(
                fw_compiler=runner,
                bw_compiler=runner,
                decompositions=lambda: import_module("torch._inductor.compile_fx").select_decomp_table(),
                partition_fn=partition,
            )(gm, example_inputs)

    return backend


@contextlib.contextmanager
def _inductor_fake_mode(inductor: bool, example_inputs: list[torch.Tensor]) -> Iterator[None]:
    """Inductor's fake mode around AOTAutograd, as ``compile_fx`` sets it (``V.set_fake_mode``, torch 2.13.0): its
    joint-graph passes read it (``fx_passes/replace_random.py`` ``fuse_seed_creation_pass``, on a graph with dropout)."""
    if not inductor:
        yield
        return
    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V
    from torch._subclasses import FakeTensorMode

    with V.set_fake_mode(detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)):
        yield


@contextlib.contextmanager
def compiled_model(model: torch.nn.Module, memory_budget: float | None = None) -> Iterator[torch.nn.Module]:
    """``model`` wrapped by ``torch.compile`` with :func:`compile_backend` (Dynamo's caches reset around it)."""
    import warnings

    import torch._dynamo

    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            # the tracker's global module hooks (names only) also fire for the OptimizedModule: balanced, harmless
            warnings.filterwarnings(
                "ignore", message=r"Using `torch.compile\(module\)` when there are global hooks"
            )
            # a compiled Module is an OptimizedModule (a Module); torch.compile's stub says only Callable
            yield cast(
                torch.nn.Module,
                torch.compile(
                    model, backend=compile_backend(memory_budget, _INDUCTOR_PASSES.get()), fullgraph=False
                ),
            )
    finally:
        torch._dynamo.reset()


def _loop_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss a framework's loop computes on the model's logits: torchtitan's ``cross_entropy_loss``
    (``components/loss.py`` at e7c0cae, June 2025: the logits flattened, upcast to fp32, mean cross-entropy)."""
    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def trace_compiled_loss(
    batch: int, seq_len: int, vocab: int, dtype: torch.dtype = torch.bfloat16, inductor: bool = False
) -> dict[str, int]:
    """The loop's loss compiled on its own (``torch.compile(loss_fn)``, :func:`compile_backend`) on fake
    ``batch`` x ``seq_len`` x ``vocab`` logits in ``dtype``, traced: the bytes the forward saves (the logits
    included, which the loop then drops: ``del pred``), the peak above the logits' gradient's inputs during the
    backward, and the gradient it returns. ``inductor``: Inductor's joint-graph passes and kernel lifetimes
    (:func:`inductor_passes`). Read by tests/trace/test_trace_compiled_loss.py against
    ``engine/activations/loss.compiled_apart_terms``."""
    import torch._dynamo
    from torch._subclasses import FakeTensorMode

    from .tracker import MemoryTracker

    torch._dynamo.reset()
    try:
        loss_fn = torch.compile(_loop_loss, backend=compile_backend(None, inductor), fullgraph=True)
        with FakeTensorMode():
            labels = torch.randint(0, vocab, (batch, seq_len))
            tracker = MemoryTracker(track_modules=False)
            with tracker:
                tracker.set_phase("forward")
                pred = torch.empty(batch, seq_len, vocab, dtype=dtype).requires_grad_()
                before = tracker.live_bytes
                loss = loss_fn(pred, labels)
                saved = tracker.live_bytes - before + pred.untyped_storage().nbytes()
                start = tracker.live_bytes
                tracker.set_phase("backward")
                grad = torch.autograd.grad(loss, pred)[0]
                peak = tracker.phase_peaks[(0, "backward")] - start
                return {
                    "saved": saved - loss.untyped_storage().nbytes(),
                    "backward_peak": peak + saved,
                    "gradient": grad.untyped_storage().nbytes(),
                }
    finally:
        torch._dynamo.reset()


@contextlib.contextmanager
def compiled_blocks(model: torch.nn.Module, memory_budget: float | None = None) -> Iterator[torch.nn.Module]:
    """``model`` with each decoder layer compiled apart in place (``Module.compile`` with :func:`compile_backend`),
    the rest eager: torchtitan's ``apply_compile`` (``torch.compile`` on each ``TransformerBlock``)."""
    import torch._dynamo

    from .checkpointing import decoder_layers

    torch._dynamo.reset()
    try:
        for layer in decoder_layers(model):
            layer.compile(backend=compile_backend(memory_budget, _INDUCTOR_PASSES.get()), fullgraph=False)
        yield model
    finally:
        torch._dynamo.reset()


def compiled_loop_loss() -> Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]:
    """The loop's loss compiled apart (:func:`_loop_loss` under ``torch.compile``), on the model's logits and the
    batch's labels shifted by one as transformers' causal-LM loss shifts them (``-100`` at the end): torchtitan's
    ``loss_fn(pred, labels)`` with ``training.compile`` (the model called without labels: ``run.drop_labels``)."""
    loss_fn = torch.compile(_loop_loss, backend=compile_backend(None, _INDUCTOR_PASSES.get()), fullgraph=True)

    def run(out: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = out.logits if hasattr(out, "logits") else out
        labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
        return loss_fn(logits, labels)

    return run
