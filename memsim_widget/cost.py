"""Hours and dollars of a training run: tokens to train over the modelled throughput, GPU-hours at a price.

``PRICES`` is a default on-demand price per GPU-hour for each catalog card, in US dollars, read from the card's
record (catalog/gpus.json: illustrative, typical list prices of GPU clouds and hyperscalers in 2025, rounded,
never fetched; each record names its date and source). Prices differ by provider, region, commitment and
date: edit the table (``set_price``) or pass ``price=`` for your own figure. A card without a price (a custom
size, a card the catalog has no price for) is priced as an H100 SXM, and ``price_note`` says so.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.catalog.gpus import GPUS
from memsim_widget.engine.estimate import Estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.errors import short_repr as _short
from memsim_widget.fast_dataclass import dataclass

#: On-demand US$ per GPU-hour of the catalog's cards that have a price (user-editable with ``set_price``).
PRICES: dict[str, float] = {gid: g.price.usd_per_gpu_hour for gid, g in GPUS.items() if g.price is not None}
#: The card whose price stands in for a card without one (``price_note`` says so).
PRICE_ASSUMED_FROM = "h100-sxm-80gb"
DEFAULT_PRICE = PRICES[PRICE_ASSUMED_FROM]
_SET_BY_USER: set[str] = set()


def set_price(gpu_id: str, dollars_per_gpu_hour: float) -> None:
    """Set the on-demand price of one card (US$ per GPU-hour)."""
    PRICES[gpu_id] = _positive("price", dollars_per_gpu_hour)
    _SET_BY_USER.add(gpu_id)


def _record_price(gpu_id: str) -> float | None:
    g = GPUS.get(gpu_id)
    return g.price.usd_per_gpu_hour if g is not None and g.price is not None else None


def price_of(gpu_id: str) -> float:
    """The table's price of a card (its record's, or ``set_price``'s); ``DEFAULT_PRICE`` (an H100 SXM's) for a
    card without one, which ``price_note`` states."""
    if gpu_id in PRICES:
        return PRICES[gpu_id]
    own = _record_price(gpu_id)
    return DEFAULT_PRICE if own is None else own


def price_note(gpu_id: str) -> str:
    """Where ``price_of(gpu_id)`` comes from, in words."""
    if gpu_id in _SET_BY_USER:
        return "set with cost.set_price"
    g = GPUS.get(gpu_id)
    if (
        g is not None
        and g.price is not None
        and PRICES.get(gpu_id, g.price.usd_per_gpu_hour) == g.price.usd_per_gpu_hour
    ):
        return f"{g.price.source}, {g.price.date}"
    if gpu_id in PRICES:
        return "the PRICES table"
    return (f"unknown for this card: an H100 SXM's ${DEFAULT_PRICE:g}/GPU-hour assumed "
            "(pass price= or cost.set_price for your own)")  # fmt: skip


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ScenarioError(name, f"must be a positive number, got {_short(value)}")
    return float(value)


def train_tokens(
    tokens: float | None = None, epochs: float | None = None, dataset_tokens: float | None = None
) -> float:
    """Tokens to train: ``tokens``, or ``epochs`` x ``dataset_tokens``."""
    if tokens is not None:
        if epochs is not None or dataset_tokens is not None:
            raise ScenarioError("tokens", "give tokens, or epochs and dataset_tokens, not both")
        return _positive("tokens", tokens)
    if epochs is None or dataset_tokens is None:
        raise ScenarioError("tokens", "give tokens, or both epochs and dataset_tokens")
    return _positive("epochs", epochs) * _positive("dataset_tokens", dataset_tokens)


@dataclass(frozen=True)
class TrainingCost:
    """Wall-clock hours, GPU-hours and dollars of training ``tokens`` tokens at a modelled throughput."""

    tokens: float
    num_gpus: int
    tokens_per_second_per_gpu: float
    price_per_gpu_hour: float
    #: Where the price comes from (``price_note``; "given" for ``price=``).
    price_source: str = "given"

    @property
    def wall_hours(self) -> float:
        """Hours on the wall clock: tokens / (tokens/s per GPU x GPUs) / 3600."""
        return self.tokens / (self.tokens_per_second_per_gpu * self.num_gpus) / 3600.0

    @property
    def gpu_hours(self) -> float:
        """GPU-hours: wall hours x GPUs."""
        return self.wall_hours * self.num_gpus

    @property
    def dollars(self) -> float:
        """GPU-hours x the price per GPU-hour."""
        return self.gpu_hours * self.price_per_gpu_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "num_gpus": self.num_gpus,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "wall_hours": self.wall_hours,
            "gpu_hours": self.gpu_hours,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "dollars": self.dollars,
            "price_source": self.price_source,
        }


def training_cost(
    est: Estimate,
    tokens: float | None = None,
    *,
    epochs: float | None = None,
    dataset_tokens: float | None = None,
    price: float | None = None,
) -> TrainingCost:
    """Hours and dollars to train ``tokens`` (or ``epochs`` x ``dataset_tokens``) with ``est``'s scenario, at
    ``price`` US$ per GPU-hour (default: ``PRICES`` for the scenario's card)."""
    return TrainingCost(
        tokens=train_tokens(tokens, epochs, dataset_tokens),
        num_gpus=est.scenario.parallel.world_size,
        tokens_per_second_per_gpu=est.tokens_per_second_per_gpu,
        price_per_gpu_hour=price_of(est.gpu.id) if price is None else _positive("price", price),
        price_source=price_note(est.gpu.id) if price is None else "given",
    )
