"""Breakdown items whose numbers are known at once and whose ``Item`` (with its formula text) is built only when
read: the step timeline sums every moment, but only a breakdown or an explanation reads the items."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from memsim_widget.engine.items import Item, allocated_of

#: What a repeat count says (``label x (term formula)``), or a callable writing it when the item is built.
Label = str | Callable[[], str]

#: Levels whose bytes the caching allocator counts (``Item.allocated_bytes``).
_COUNTED = ("tensor", "allocator")


class LazyItem:
    """An ``Item``'s numbers (same names: ``category``, ``item``, ``bytes``, ``level``, ``tensors``,
    ``allocated_bytes``); ``build`` writes its formula (``label x (term formula)``) and makes the ``Item``."""

    __slots__ = (
        "category",
        "item",
        "bytes",
        "level",
        "tensors",
        "allocated_bytes",
        "_label",
        "_formula",
        "_built",
        "shares",
        "cut",
    )

    def __init__(
        self,
        category: str,
        item: str,
        nbytes: int,
        level: str,
        tensors: int,
        label: Label,
        formula: str,
        shares: tuple[float, ...] = (),
        cut: tuple[int, int] = (0, 0),
    ) -> None:
        self.category, self.item, self.bytes, self.level, self.tensors = (
            category,
            item,
            nbytes,
            level,
            tensors,
        )
        self._label, self._formula, self._built = label, formula, None
        # each tensor's share of the bytes (engine/counters/alloc_stream), once per repeat
        self.shares = shares
        # (the tensors layer 0's set lacks, layer 0's sets among the repeats): its per-tensor sizes stay the
        # shares' where layer 0 lacks whole cycles of them (``timeline.layer0_cut``)
        self.cut = cut
        if level not in _COUNTED or nbytes <= 0:  # Item.allocated_bytes, without building the Item
            self.allocated_bytes = 0
        else:
            self.allocated_bytes = allocated_of(nbytes, max(tensors, 1))

    def build(self) -> Item:
        """The breakdown item (built once)."""
        if self._built is None:
            label = self._label() if callable(self._label) else self._label
            note = f"{label} x ({self._formula})" if label else self._formula
            self._built = Item(self.category, self.item, self.bytes, note, self.level, self.tensors)
        return self._built


def built(items: Iterable[Item | LazyItem]) -> tuple[Item, ...]:
    """The items, lazy ones built."""
    return tuple(i.build() if isinstance(i, LazyItem) else i for i in items)


class ItemGroup:
    """The items of one named group of the step (``engine/step/moments``) with their sums, added once however many
    moments hold the group; the items themselves are built when a moment's breakdown is read."""

    __slots__ = ("entries", "raw", "tensor", "allocated", "_pool")

    def __init__(self, entries: Sequence[Item | LazyItem]) -> None:
        self.entries = entries
        raw = tensor = allocated = 0
        for i in entries:
            raw += i.bytes
            allocated += i.allocated_bytes
            if i.level == "tensor":
                tensor += i.bytes
        self.raw, self.tensor, self.allocated = raw, tensor, allocated
        self._pool: tuple[object, object, tuple[int, int, int]] | None = None

    def pool_sums(self, persistent: Collection[str], loss_names: set[str]) -> tuple[int, int, int]:
        """(allocated, allocated in ``persistent`` categories, allocated loss buffers) as
        ``engine/counters/overhead.pool_bytes`` counts them (kept for equal arguments: every moment holding the group,
        and every estimate sharing a cached group, passes the same ones)."""
        pool = self._pool
        if (
            pool is not None
            and (pool[0] is persistent or pool[0] == persistent)
            and (pool[1] is loss_names or pool[1] == loss_names)
        ):
            return pool[2]
        long = loss = 0
        for i in self.entries:
            if i.category in persistent:
                long += i.allocated_bytes
            elif i.item in loss_names:
                loss += i.allocated_bytes
        self._pool = (persistent, loss_names, (self.allocated, long, loss))
        return self._pool[2]
