"""Dispatch-mode tracker of live tensor storage bytes during a (fake or real) training step."""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memsim_widget.names import Name


class Role(Name):
    """What a traced storage is for. ``UNSHARDED_PARAMETER``: a parameter FSDP gathered for its unit's compute;
    ``COLLECTIVE``: a communication buffer (all-gather, reduce-scatter staging) of a multi-GPU trace."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATION = "activation"
    TEMPORARY = "temporary"
    INPUT = "input"
    UNSHARDED_PARAMETER = "unsharded_parameter"
    COLLECTIVE = "collective"


class StepPhase(Name):
    """The parts of a traced training step, in order."""

    SETUP = "setup"
    FORWARD = "forward"
    LOSS = "loss"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"
    ZERO_GRAD = "zero_grad"


#: The roles and phases in order (members, which are their string values).
ROLES = tuple(Role)
PHASES = tuple(StepPhase)
_EXPLICIT = frozenset(set(Role) - {Role.ACTIVATION, Role.TEMPORARY})
_PRIM_DEVICE = torch.ops.prim.device.default
#: The op suffix of a storage in host memory (MemoryTracker.on_host): 0 bytes for good.
_HOST = " (host)"
#: The op suffix of a storage that is another's on the device (``MemoryTracker._alias``): 0 bytes for good.
_ALIAS = " (alias)"
#: Ops whose fake (Meta) kernel returns a new tensor where the device kernel returns its input. The
#: functional collectives' ``wait_tensor`` (torch 2.13.0 ``distributed/_functional_collectives.py``:
#: ``_wait_tensor_meta`` is ``torch.empty_like(self)``) waits on the collective's work and returns the same
#: tensor on the GPU (``torch/csrc/distributed/c10d/Functional.cpp``, ``c10d::wait_tensor``: ``return
#: tensor``); DTensor's redistributions and TP's all-reduces call it after every collective.
_ALIASING_WAITS = frozenset({"wait_tensor"})
_LAYER_RE = re.compile(r"\.(?:layers|layer|h|block|blocks)\.(\d+)(?:\.|$)")
#: The cyclic garbage collector inside a trace (``MemoryTracker``): it collects what the process made before, then
#: runs no automatic collection; at each phase mark it collects the two young generations (``gc.collect(1)``), so a
#: cycle dropped in a phase is freed at the phase's end, and one in the oldest generation lives to the end of the
#: trace. Dynamo leaves the first step's model output (GPT-2's logits, loss and returned KV cache) in such a cycle of
#: its tracing objects, which its own ``gc.collect(1)`` after each compile moves to the oldest generation while it is
#: still reachable (``run_gc_after_compile``, torch 2.13.0 ``_dynamo/convert_frame.py``). With automatic collections,
#: when the next one came depended on every allocation the process had made (the engine's estimate first,
#: ``CI=true``): a compiled GPT-2 b2 s512 trace read 105.6 or 111.8 MB (docs/trace.md, "Garbage collection").
YOUNG_GENERATIONS = 1


def _keep(*_objs: Any) -> None:
    """A finalizer's no-op: its arguments stay alive until the finalized object is dropped."""


class StorageRecord:
    """One tensor storage seen by the tracker, with its lifetime in tracker sequence numbers."""

    __slots__ = (
        "nbytes",
        "shape",
        "dtype",
        "op",
        "module",
        "phase",
        "step",
        "alloc_seq",
        "free_seq",
        "role",
        "saved",
        "ref",
        "stream",
        "__weakref__",
    )

    def __init__(
        self, nbytes: int, shape: tuple, dtype: str, op: str, module: str, phase: str, step: int, seq: int
    ):
        """Create a record for a storage allocated at sequence number ``seq``."""
        self.nbytes = nbytes
        self.shape = shape
        self.dtype = dtype
        self.op = op
        self.module = module
        self.phase = phase
        self.step = step
        self.alloc_seq = seq
        self.free_seq: int | None = None
        self.role: str | None = None
        self.saved = False
        self.ref: Any = None
        self.stream = 0  # the CUDA stream it is allocated on: 0 the compute stream (trace/replay.py)

    def alive_at(self, seq: int) -> bool:
        """Whether the storage was live right after event ``seq``."""
        return self.alloc_seq <= seq and (self.free_seq is None or self.free_seq > seq)

    @property
    def layer(self) -> int | None:
        """Index of the repeated block (decoder layer) the storage was created in, if any."""
        m = _LAYER_RE.search("." + self.module)
        return int(m.group(1)) if m else None

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view of the record."""
        return {
            "bytes": self.nbytes,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "role": self.role,
            "op": self.op,
            "module": self.module,
            "phase": self.phase,
            "step": self.step,
            "saved_for_backward": self.saved,
        }


#: torchao's wrapper subclasses and the attribute holding their memory: ``Float8TrainingTensor`` (fp8 bytes in
#: ``_data``) and FSDP2's fp8 all-gather weight ``WeightWithDynamicFloat8CastTensor`` (the shard in ``_tensor``).
_TORCHAO_WRAPPERS = {"Float8TrainingTensor": "_data", "WeightWithDynamicFloat8CastTensor": "_tensor"}


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding the storage: a DTensor's local shard, the inner tensor of a torchao wrapper
    (``_TORCHAO_WRAPPERS``), else ``t`` itself.

    A wrapper subclass has no memory of its own (on a GPU its storage has no data pointer); under the fake mode
    that storage reports the wrapper's declared (bf16) size, 2 B per element no GPU allocates. FSDP2's fp8
    all-gather makes such wrappers with aten ops (its sharded weights, and ``as_strided`` of the gathered fp8
    bytes as the unsharded parameters; docs/fidelity.md, "fp8")."""
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        t = local
    inner = getattr(t, _TORCHAO_WRAPPERS.get(type(t).__name__, "_local_tensor"), None)
    return inner if isinstance(inner, torch.Tensor) else t


#: torchao wrappers holding their memory in several inner tensors: ``NF4Tensor`` (torchao 0.18.0,
#: ``__tensor_flatten__``: its codes, scalers, factors, scaler mean and 16-entry lookup table).
_TORCHAO_MULTI = {
    "NF4Tensor": ("quantized_scalers", "quantization_factor", "quantized_data", "scaler_mean", "nf4"),
}


def _parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The inner tensors holding the memory of a multi-tensor torchao wrapper (``_TORCHAO_MULTI``; a DTensor's
    local one), else none."""
    t = _local(t)
    names = _TORCHAO_MULTI.get(type(t).__name__, ())
    return [x for x in (getattr(t, n, None) for n in names) if isinstance(x, torch.Tensor)]


def _dtype_name(dtype: torch.dtype) -> str:
    """Short dtype name, e.g. 'bfloat16'."""
    return str(dtype).removeprefix("torch.")


class MemoryTracker(TorchDispatchMode):
    """Counts bytes of live tensor storages created by aten ops, deduplicated by storage identity.

    Every op output's untyped storage is registered once (views share it) and released when the storage object is
    garbage collected (weakref callback). Events get a global sequence number so that the set of live storages at
    any moment (in particular the peak) can be rebuilt afterwards from the records.
    """

    #: The tracker whose ``__torch_dispatch__`` is running an op (None outside any): what a handler the op runs
    #: re-enters with ``inside_dispatch`` (trace/tp_plan.py, ``loss_context``).
    dispatching: MemoryTracker | None = None

    def __init__(
        self,
        root: torch.nn.Module | None = None,
        *,
        track_modules: bool = True,
        mark_saved: bool = False,
        progress: bool = False,
    ):
        """Create a tracker; ``root`` names modules, ``mark_saved`` flags storages autograd saves for backward."""
        super().__init__()
        self._mark_saved = mark_saved
        self.records: list[StorageRecord] = []
        self._live: dict[int, StorageRecord] = {}
        self.live_bytes = 0
        self.seq = 0
        self.op_count = 0
        self.phase = "setup"
        self.step = 0
        self.peak_bytes = 0
        self.peak_seq = -1
        self.peak_info: dict[str, Any] = {}
        self.step_peaks: dict[int, dict[str, Any]] = {}
        self.phase_peaks: dict[tuple[int, str], int] = {}
        self.marks: list[dict[str, Any]] = []
        self.events: list[tuple[int, int, int, str, int]] = []  # (seq, op index, step, phase, live bytes)
        self.untracked_inputs = 0
        self.scope_role: str | None = None
        self.scope_stream = 0
        self._orig_resize: Any = None
        self._gc_outer: bool | None = None  # automatic collection on before __enter__; None: not entered
        self._closed = False
        self._names: dict[int, str] = {}
        self._module_stack: list[str] = []
        self._hook_handles: list[Any] = []
        self._track_modules = track_modules
        if root is not None:
            self._names = {id(m): n for n, m in root.named_modules()}
        self._saved_hooks: Any = None
        self._fusing: str | None = None  # "fused" or "host": storages made count 0 bytes
        self._bar: Any = None
        if progress and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self._bar = tqdm(desc="trace", unit="op", mininterval=0.5)
            except ImportError:  # pragma: no cover - tqdm is optional
                self._bar = None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Stay off while ``torch.compile`` traces and partitions (its fake ops are no step's tensors) and on while
        the compiled graphs run (trace/compiled.py)."""
        return True

    @contextlib.contextmanager
    def fused(self) -> Iterator[None]:
        """Storages first made inside the block count 0 bytes: a compiled graph's node that Inductor computes
        inside a fused kernel and never writes to memory (trace/compiled.py)."""
        outer, self._fusing = self._fusing, "fused"
        try:
            yield
        finally:
            self._fusing = outer

    @contextlib.contextmanager
    def on_host(self) -> Iterator[None]:
        """Storages first made inside the block count 0 bytes: a copy in host memory, which the GPU's counters
        never see (activation offloading, trace/torchtune_memory.py)."""
        outer, self._fusing = self._fusing, "host"
        try:
            yield
        finally:
            self._fusing = outer

    @contextlib.contextmanager
    def inside_dispatch(self) -> Iterator[None]:
        """Make the ops run in the block reach the tracker although it is dispatching an op itself.

        A dispatch mode is off while its own ``__torch_dispatch__`` runs the op (torch 2.13.0
        ``utils/_python_dispatch.py``, ``_pop_mode_temporarily``), so the local ops a DTensor handler runs inside
        that op (``distributed/tensor/parallel/loss.py``'s loss-parallel kernels) are never seen; pushed again for
        the block (without ``__enter__``'s hooks), the tracker counts them. Only for code on plain tensors: an op
        on a DTensor inside the block would dispatch through the tracker again."""
        from torch.utils._python_dispatch import _pop_mode, _push_mode

        _push_mode(self)
        try:
            yield
        finally:
            _pop_mode()

    # ------------------------------------------------------------------ registration
    def _register(self, t: torch.Tensor, op: str, role: str | None = None) -> StorageRecord | None:
        """Register the storage of ``t`` (a DTensor's local shard; a torchao NF4 wrapper's inner tensors) if
        unseen; return its record (the first inner tensor's)."""
        parts = _parts(t)
        if parts:
            recs = [self._register(x, op, role) for x in parts]
            return recs[0]
        t = _local(t)
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        key = id(st)
        rec = self._live.get(key)
        if rec is not None:
            # resized in place, outside UntypedStorage.resize_ (a storage on the host stays 0 bytes)
            if st.nbytes() != rec.nbytes and not rec.op.endswith((_HOST, _ALIAS)):
                rec = self._resized(st, rec)
            if role is not None:
                rec.role = role
            return rec
        module = self._module_stack[-1] if self._module_stack else ""
        rec = StorageRecord(
            st.nbytes(), tuple(t.shape), _dtype_name(t.dtype), op, module, self.phase, self.step, self.seq
        )
        rec.role = role if role is not None else self.scope_role
        rec.stream = self.scope_stream
        rec.ref = weakref.ref(st, self._make_free_cb(key, rec))
        self._live[key] = rec
        self.records.append(rec)
        self.live_bytes += rec.nbytes
        return rec

    def _resized(self, st: torch.UntypedStorage, rec: StorageRecord) -> StorageRecord:
        """Follow a storage whose size changed: end ``rec`` and start a record of the new size.

        FSDP2 frees and re-allocates unsharded parameters with ``UntypedStorage.resize_``
        (docs/memory-facts.md#tracing-one-rank-on-a-cpu, pitfall 3); one record per size keeps the bytes live
        at any past moment exact.
        """
        self.seq += 1
        rec.free_seq = self.seq
        self.live_bytes -= rec.nbytes
        module = self._module_stack[-1] if self._module_stack else ""
        new = StorageRecord(
            st.nbytes(), rec.shape, rec.dtype, rec.op, module, self.phase, self.step, self.seq
        )
        new.role, new.saved, new.stream = rec.role, rec.saved, self.scope_stream
        new.ref = weakref.ref(st, self._make_free_cb(id(st), new))
        rec.ref = None
        self._live[id(st)] = new
        self.records.append(new)
        self.live_bytes += new.nbytes
        self._after_alloc("resize_")
        return new

    def _on_resize(self, st: torch.UntypedStorage) -> None:
        """After ``UntypedStorage.resize_``: follow the new size of a tracked storage."""
        rec = self._live.get(id(st))
        if rec is not None and st.nbytes() != rec.nbytes:
            self._resized(st, rec)

    @contextlib.contextmanager
    def role_scope(self, role: str | None, stream: int | None = None) -> Iterator[None]:
        """Give storages first seen inside the block ``role`` (unless registered with another) and, if given,
        the CUDA ``stream`` they are allocated on."""
        outer, self.scope_role = self.scope_role, role
        outer_stream = self.scope_stream
        if stream is not None:
            self.scope_stream = stream
        try:
            yield
        finally:
            self.scope_role, self.scope_stream = outer, outer_stream

    def _make_free_cb(self, key: int, rec: StorageRecord):  # noqa: ANN202
        """Build the weakref callback that releases ``rec``."""

        def _cb(_ref: Any) -> None:
            if self._closed or rec.free_seq is not None:
                return
            if self._live.get(key) is rec:
                del self._live[key]
            self.seq += 1
            rec.free_seq = self.seq
            self.live_bytes -= rec.nbytes
            self.events.append((self.seq, self.op_count, self.step, self.phase, self.live_bytes))

        return _cb

    def register(
        self, tensors: Iterable[torch.Tensor] | torch.Tensor, role: str, op: str | None = None
    ) -> None:
        """Register (or re-label) the storages of ``tensors`` with an explicit role."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        self.seq += 1
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._register(t, op or f"<{role}>", role)
        self._after_alloc(op or f"<{role}>")

    def relabel(self, tensors: Iterable[torch.Tensor] | torch.Tensor, role: str) -> None:
        """Set the role of already tracked storages (unknown ones are registered)."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._register(t, f"<{role}>", role)

    def mark_saved(self, t: torch.Tensor) -> None:
        """Flag the storage of ``t`` as saved for backward by autograd."""
        rec = self._register(t, "<saved>")
        if rec is not None:
            rec.saved = True

    # ------------------------------------------------------------------ phases
    def set_phase(self, phase: str, step: int | None = None) -> None:
        """Enter a new phase (and optionally a new step); records a mark with the live bytes. Inside the tracker's
        context, the cyclic garbage dropped in the phase ending is freed first (``YOUNG_GENERATIONS``)."""
        if self._gc_outer is not None:
            gc.collect(YOUNG_GENERATIONS)
        self.phase = phase
        if step is not None:
            self.step = step
        self.seq += 1
        self.marks.append(
            {
                "seq": self.seq,
                "op_index": self.op_count,
                "step": self.step,
                "phase": phase,
                "live": self.live_bytes,
            }
        )
        self.events.append((self.seq, self.op_count, self.step, self.phase, self.live_bytes))

    def mark_seq(self, step: int, phase: str) -> int | None:
        """Sequence number at which ``phase`` of ``step`` started (None if it never did)."""
        for m in self.marks:
            if m["step"] == step and m["phase"] == phase:
                return m["seq"]
        return None

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        """Run the op, then register the storages of its tensor outputs."""
        kwargs = kwargs or {}
        if func is _PRIM_DEVICE:
            return func(*args, **kwargs)
        self.op_count += 1
        live = self._live
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor):
                for x in _parts(a) or [a]:  # an NF4 wrapper's inner tensors, each tracked on its own
                    try:
                        k = id(_local(x).untyped_storage())
                    except (RuntimeError, NotImplementedError):
                        continue
                    if k not in live:
                        self.untracked_inputs += 1
                        self.seq += 1
                        self._register(x, "<untracked input>", "input")
        outer, MemoryTracker.dispatching = MemoryTracker.dispatching, self
        try:
            out = func(*args, **kwargs)
        finally:
            MemoryTracker.dispatching = outer
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        opname = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else name
        self.seq += 1
        first = len(self.records)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._register(t, opname)
        if self._fusing:  # made inside a fused kernel: no buffer
            for rec in self.records[first:]:
                self.live_bytes -= rec.nbytes
                rec.nbytes = 0
                rec.op = f"{opname} ({self._fusing})"
        if opname in _ALIASING_WAITS and args and isinstance(out, torch.Tensor):
            self._alias(args[0], out, self.records[first:])
        self._after_alloc(opname)
        if self._bar is not None and not self.op_count & 255:
            self._bar.update(256)
            self._bar.set_postfix_str(
                f"step {self.step} {self.phase} {self.live_bytes / 2**20:.0f} MiB", False
            )
        return out

    def _alias(self, source: torch.Tensor, out: torch.Tensor, made: list[StorageRecord]) -> None:
        """``out`` is ``source`` itself on the device (``_ALIASING_WAITS``): its new fake storage counts 0 bytes
        and keeps ``source``'s storage alive while it lives, so ``source``'s record ends when the later of the two
        is dropped."""
        try:
            src, dst = _local(source).untyped_storage(), _local(out).untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if src is dst:
            return
        for rec in made:
            self.live_bytes -= rec.nbytes
            rec.nbytes = 0
            rec.op = f"{rec.op}{_ALIAS}"
        weakref.finalize(dst, _keep, src)

    def _after_alloc(self, opname: str) -> None:
        """Update peak bookkeeping after an allocation event."""
        live = self.live_bytes
        self.events.append((self.seq, self.op_count, self.step, self.phase, live))
        key = (self.step, self.phase)
        if live > self.phase_peaks.get(key, -1):
            self.phase_peaks[key] = live
        sp = self.step_peaks.get(self.step)
        if sp is None or live > sp["bytes"]:
            self.step_peaks[self.step] = {
                "bytes": live,
                "seq": self.seq,
                "op": opname,
                "phase": self.phase,
                "module": self._module_stack[-1] if self._module_stack else "",
            }
        if live > self.peak_bytes:
            self.peak_bytes = live
            self.peak_seq = self.seq

    # ------------------------------------------------------------------ module tracking
    def _pre_hook(self, module: torch.nn.Module, _args: Any) -> None:
        """Push the module name on the module stack (not inside a compiled graph: Dynamo would bake the stack's
        mutations into it)."""
        if torch.compiler.is_compiling():
            return
        self._module_stack.append(self._names.get(id(module), type(module).__name__))

    def _post_hook(self, module: torch.nn.Module, _args: Any, _out: Any) -> None:
        """Pop the module stack."""
        if torch.compiler.is_compiling():
            return
        if self._module_stack:
            self._module_stack.pop()

    def __enter__(self):  # noqa: ANN204
        """Enter dispatch mode, install module hooks and the saved-tensor hook; collect the garbage made before the
        trace and turn automatic collection off until exit (``YOUNG_GENERATIONS``: what ran before in the process
        then changes no free's timing)."""
        self._gc_outer = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            if self._track_modules:
                from torch.nn.modules.module import (
                    register_module_forward_hook,
                    register_module_forward_pre_hook,
                )

                self._hook_handles = [
                    register_module_forward_pre_hook(self._pre_hook),
                    register_module_forward_hook(self._post_hook, always_call=True),
                ]

            if self._mark_saved:

                def _pack(t: torch.Tensor) -> torch.Tensor:
                    self.mark_saved(t)
                    return t.detach()  # no grad_fn: avoids a reference cycle that would delay frees

                self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(_pack, lambda t: t)
                self._saved_hooks.__enter__()
            self._follow_resize()
            return super().__enter__()
        except BaseException:  # a failed start leaves the caller's collector as it was
            if self._gc_outer:
                gc.enable()
            raise

    def _follow_resize(self) -> None:
        """Wrap ``UntypedStorage.resize_`` (not an aten op, so dispatch never sees it) to follow resizes.

        The function in place at enter is kept and restored at exit, so nested trackers unwind in order.
        """
        orig = self._orig_resize = torch.UntypedStorage.resize_

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = orig(st, size)
            self._on_resize(st)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

    def __exit__(self, *exc: Any) -> None:
        """Leave dispatch mode and remove hooks."""
        super().__exit__(*exc)
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
            self._orig_resize = None
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(*exc)
            self._saved_hooks = None
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        self._module_stack.clear()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._gc_outer:
            gc.enable()
        self._gc_outer = None

    def close(self) -> None:
        """Stop reacting to later frees (records stay readable)."""
        self._closed = True

    # ------------------------------------------------------------------ analysis
    def final_role(self, rec: StorageRecord) -> str:
        """Role of a record: explicit role, else activation if made in forward/loss and alive into backward."""
        if rec.role in _EXPLICIT:
            return rec.role  # pyright: ignore[reportReturnType]  (in _EXPLICIT: not None)
        if rec.phase in ("forward", "loss"):
            bwd = self.mark_seq(rec.step, "backward")
            if bwd is not None and (rec.free_seq is None or rec.free_seq > bwd):
                return "activation"
            if bwd is None and rec.free_seq is None:
                return "activation"
        return "temporary"

    def alive_at(self, seq: int) -> list[StorageRecord]:
        """Records live right after event ``seq``."""
        return [r for r in self.records if r.alloc_seq <= seq and (r.free_seq is None or r.free_seq > seq)]

    def by_role_at(self, seq: int) -> dict[str, int]:
        """Bytes per role live right after event ``seq``."""
        out: dict[str, int] = dict.fromkeys(ROLES, 0)
        for r in self.alive_at(seq):
            role = self.final_role(r)
            out[role] = out.get(role, 0) + r.nbytes
        return out

    def top_at(self, seq: int, n: int = 20) -> list[dict[str, Any]]:
        """The ``n`` largest storages live right after event ``seq``."""
        recs = sorted(self.alive_at(seq), key=lambda r: r.nbytes, reverse=True)[:n]
        out = []
        for r in recs:
            d = r.to_dict()
            d["role"] = self.final_role(r)
            out.append(d)
        return out

    def live_bytes_at(self, seq: int) -> int:
        """Total live bytes right after event ``seq``."""
        return sum(r.nbytes for r in self.alive_at(seq))

    def timeline(self, max_points: int = 2000) -> list[dict[str, Any]]:
        """Down-sampled timeline keeping the maximum of each bucket (so the peak survives)."""
        ev = self.events
        if not ev:
            return []
        if len(ev) <= max_points:
            picked = ev
        else:
            size = -(-len(ev) // max_points)
            picked = [max(ev[i : i + size], key=lambda e: e[4]) for i in range(0, len(ev), size)]
        return [
            {"seq": e[0], "op_index": e[1], "step": e[2], "phase": e[3], "live_bytes": e[4]} for e in picked
        ]
