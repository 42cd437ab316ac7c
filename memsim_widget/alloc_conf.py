"""``PYTORCH_CUDA_ALLOC_CONF``: the caching allocator's settings, parsed as PyTorch parses them.

Read in ``c10/core/AllocatorConfig.cpp`` (pytorch/pytorch commit 065861fba7598880aa3216822742a1172d0a197c:
``parseArgs``, ``ConfigTokenizer``/``lexArgs``, ``parseMaxSplitSize``, ``parseRoundUpPower2Divisions``,
``parseGarbageCollectionThreshold``) and the headers of torch 2.13.0 (``c10/core/AllocatorConfig.h``,
``c10/cuda/CUDAAllocatorConfig.h``: the keys, ``max_non_split_rounding`` 20 MiB by default). A leaf module: the
scenario's rules check ``allocator_conf`` with it, ``engine/counters/allocator.py`` replays under it.
"""

from __future__ import annotations

from memsim_widget.errors import ScenarioError
from memsim_widget.fast_dataclass import dataclass

MiB = 1024**2
#: The large segment (``kLargeBuffer``): the least ``max_split_size_mb`` and ``max_non_split_rounding_mb``.
LARGE_BUFFER = 20 * MiB
#: ``roundup_power2_divisions`` has one entry per power of two from 1 MiB to 64 GiB (16 intervals).
POWER2_INTERVALS = 16


@dataclass(frozen=True)
class AllocatorConf:
    """The caching allocator's settings that change memory (PyTorch's defaults)."""

    expandable_segments: bool = False
    #: Blocks of this size or more are never split (``max_split_size_mb``); None: unlimited.
    max_split_size: int | None = None
    #: An oversize request may take a cached block at most this much larger (``max_non_split_rounding_mb``).
    max_non_split_rounding: int = LARGE_BUFFER
    #: Divisions per power-of-two interval, 1 MiB .. 64 GiB (``roundup_power2_divisions``); 0: off.
    roundup_power2_divisions: tuple[int, ...] = (0,) * POWER2_INTERVALS
    #: Reclaim cached blocks above this share of the allowed memory (needs ``per_process_memory_fraction``).
    garbage_collection_threshold: float = 0.0
    #: ``torch.cuda.set_per_process_memory_fraction`` (or the conf key of that name); None: not set.
    per_process_memory_fraction: float | None = None
    #: The string it was parsed from (for reports).
    text: str = ""

    def divisions(self, size: int) -> int:
        """The number of power-of-two divisions that apply to ``size`` (``roundup_power2_divisions(size)``)."""
        index = size.bit_length() - 1 - 20  # intervals start at 1 MiB
        return self.roundup_power2_divisions[min(max(index, 0), POWER2_INTERVALS - 1)]


#: PyTorch's defaults (no ``PYTORCH_CUDA_ALLOC_CONF``).
DEFAULT_CONF = AllocatorConf()
#: Options PyTorch accepts that do not change the bytes this replay counts (host pinned memory, locking, backend).
_NO_MEMORY_EFFECT = (
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold",
    "pinned_max_cached_size",
    "pinned_free_catch_all",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
)
_BOOL_OPTIONS = frozenset(
    (
        "expandable_segments",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "pinned_use_background_threads",
        "pinned_free_catch_all",
        "graph_capture_record_stream_reuse",
        "throw_on_cudamalloc_oom",
    )
)
#: Every option of ``PYTORCH_CUDA_ALLOC_CONF`` this replay accepts (torch 2.13.0's keys for the native backend).
ALLOC_CONF_OPTIONS = (
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "backend",
    *_NO_MEMORY_EFFECT,
)


def _tokens(text: str) -> list[str]:
    """PyTorch's ``ConfigTokenizer``: ``,``, ``:``, ``[`` and ``]`` are tokens, whitespace is dropped."""
    out: list[str] = []
    buf = ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                out.append(buf)
                buf = ""
            out.append(ch)
        elif not ch.isspace():
            buf += ch
    if buf:
        out.append(buf)
    return out


def _int(field_: str, option: str, token: str) -> int:
    """An integer option value, or an error naming the option."""
    try:
        return int(token)
    except ValueError:
        raise ScenarioError(field_, f"{option} takes an integer, got {token!r}") from None


def _power2_divisions(field_: str, toks: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """``roundup_power2_divisions``: one power of two for every interval, or ``[64:8,256:4,>:1]`` (MiB
    bounds: each sets its interval; the first also those below it, ``>`` all after the last)."""
    div = [0] * POWER2_INTERVALS

    def check(v: int) -> int:
        if v != 0 and v & (v - 1):
            raise ScenarioError(field_, f"roundup_power2_divisions values must be powers of 2 or 0, got {v}")
        return v

    if toks[i] != "[":
        v = check(_int(field_, "roundup_power2_divisions", toks[i]))
        return (v,) * POWER2_INTERVALS, i
    first, last = True, 0
    i += 1
    while i < len(toks) and toks[i] != "]":
        bound = toks[i]
        if i + 2 >= len(toks) or toks[i + 1] != ":":
            raise ScenarioError(field_, "roundup_power2_divisions entries are written bound:divisions")
        v = check(_int(field_, "roundup_power2_divisions", toks[i + 2]))
        if bound == ">":
            div[last:] = [v] * (POWER2_INTERVALS - last)
        else:
            mb = _int(field_, "roundup_power2_divisions", bound)
            if mb <= 0 or mb & (mb - 1):
                raise ScenarioError(field_, f"roundup_power2_divisions bounds must be powers of 2, got {mb}")
            index = min(mb.bit_length() - 1, POWER2_INTERVALS - 1)
            if first:
                div[:index] = [v] * index
                first = False
            div[index] = v
            last = index
        i += 3
        if i < len(toks) and toks[i] == ",":
            i += 1
    if i >= len(toks):
        raise ScenarioError(field_, "roundup_power2_divisions: missing ']'")
    return tuple(div), i


def _option_value(field_: str, option: str, toks: list[str], i: int, values: dict[str, object]) -> int:
    """Parse one option's value starting at token ``i`` into ``values``; returns the last token used."""
    if i >= len(toks) or toks[i] in ",:]" or (toks[i] == "[" and option != "roundup_power2_divisions"):
        raise ScenarioError(field_, f"{option} needs a value ({option}:VALUE)")
    tok = toks[i]
    if option == "roundup_power2_divisions":
        values[option], i = _power2_divisions(field_, toks, i)
    elif option in ("max_split_size_mb", "max_non_split_rounding_mb"):
        mb = _int(field_, option, tok)
        if mb < LARGE_BUFFER // MiB:
            raise ScenarioError(field_, f"{option} must be >= {LARGE_BUFFER // MiB}, got {mb}")
        values[option] = mb * MiB
    elif option in ("garbage_collection_threshold", "per_process_memory_fraction"):
        try:
            x = float(tok)
        except ValueError:
            raise ScenarioError(field_, f"{option} takes a number, got {tok!r}") from None
        if not (0.0 < x < 1.0 if option == "garbage_collection_threshold" else 0.0 < x <= 1.0):
            raise ScenarioError(
                field_, f"{option} must be in (0, 1{')' if 'garbage' in option else ']'}, got {tok}"
            )
        values[option] = x
    elif option == "backend":
        if tok not in ("native", "cudaMallocAsync"):
            raise ScenarioError(field_, f"backend must be native or cudaMallocAsync, got {tok!r}")
        if tok == "cudaMallocAsync":
            raise ScenarioError(
                field_, "backend:cudaMallocAsync is not simulated (only the native allocator)"
            )
    elif option in _BOOL_OPTIONS:
        if tok not in ("True", "False"):
            raise ScenarioError(field_, f"{option} takes True or False, got {tok!r}")
        values[option] = tok == "True"
    else:  # the host allocator's integer options
        _int(field_, option, tok)
    return i


def parse_alloc_conf(text: str, field_: str = "allocator_conf") -> AllocatorConf:
    """An ``AllocatorConf`` from a ``PYTORCH_CUDA_ALLOC_CONF`` string, parsed as PyTorch's ``parseArgs``
    does (``key:value`` pairs separated by commas); an unknown option or a bad value raises one
    ``ScenarioError`` naming it."""
    from memsim_widget.errors import choice_error, short_repr

    if not isinstance(text, str):
        raise ScenarioError(field_, f"must be a string like 'expandable_segments:True', got {text!r}")
    toks = _tokens(text)
    values: dict[str, object] = {}
    i = 0
    while i < len(toks):
        option = toks[i]
        if option not in ALLOC_CONF_OPTIONS:
            hint = choice_error(field_, option, ALLOC_CONF_OPTIONS).message.split(" is not allowed", 1)[1]
            raise ScenarioError(field_, f"unknown PYTORCH_CUDA_ALLOC_CONF option {short_repr(option)}{hint}")
        if i + 1 >= len(toks) or toks[i + 1] != ":":
            raise ScenarioError(field_, f"{option} needs a value ({option}:VALUE)")
        i = _option_value(field_, option, toks, i + 2, values) + 1
        if i < len(toks):
            if toks[i] != ",":
                raise ScenarioError(field_, f"expected ',' after {option}, got {toks[i]!r}")
            i += 1
    return AllocatorConf(
        expandable_segments=bool(values.get("expandable_segments", False)),
        max_split_size=values.get("max_split_size_mb"),  # type: ignore[arg-type]
        max_non_split_rounding=values.get("max_non_split_rounding_mb", LARGE_BUFFER),  # type: ignore[arg-type]
        roundup_power2_divisions=values.get("roundup_power2_divisions", (0,) * POWER2_INTERVALS),  # type: ignore[arg-type]
        garbage_collection_threshold=values.get("garbage_collection_threshold", 0.0),  # type: ignore[arg-type]
        per_process_memory_fraction=values.get("per_process_memory_fraction"),  # type: ignore[arg-type]
        text=text,
    )


def alloc_conf_error(text: str | None) -> str | None:
    """The message of what is wrong with a ``PYTORCH_CUDA_ALLOC_CONF`` string (None: nothing, or unset)."""
    if text is None:
        return None
    try:
        parse_alloc_conf(text)
    except ScenarioError as exc:
        return exc.message
    return None
