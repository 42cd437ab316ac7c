"""Hours and dollars of a training run: tokens to train over the modelled throughput, GPU-hours at a price.

``PRICES`` is a default on-demand price per GPU-hour for each catalog card, in US dollars: typical list prices
of GPU clouds and hyperscalers in 2025, rounded, never fetched. Prices differ by provider, region, commitment
and date: edit the table (``set_price``) or pass ``price=`` for your own figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memsim_widget.engine.estimate import Estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.errors import short_repr as _short

#: On-demand US$ per GPU-hour (2025 list prices, rounded; user-editable with ``set_price``).
PRICES: dict[str, float] = {
    "v100-16gb": 0.90,
    "v100-32gb": 1.10,
    "t4": 0.35,
    "a10": 0.75,
    "l4": 0.80,
    "l40s": 1.20,
    "a100-40gb": 1.30,
    "a100-80gb": 1.80,
    "h100-pcie-80gb": 2.50,
    "h100-sxm-80gb": 3.00,
    "h200": 3.80,
    "b200": 5.50,
    "rtx-3090": 0.25,
    "rtx-4090": 0.40,
    "rtx-5090": 0.70,
    "rtx-a6000": 0.50,
    "mi250x": 1.50,
    "mi300x": 2.50,
}
#: A card not in the table (a custom size): an H100 SXM's price.
DEFAULT_PRICE = PRICES["h100-sxm-80gb"]


def set_price(gpu_id: str, dollars_per_gpu_hour: float) -> None:
    """Set the on-demand price of one card (US$ per GPU-hour)."""
    PRICES[gpu_id] = _positive("price", dollars_per_gpu_hour)


def price_of(gpu_id: str) -> float:
    """The table's price of a card (``DEFAULT_PRICE`` for cards not in it)."""
    return PRICES.get(gpu_id, DEFAULT_PRICE)


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

    def to_dict(self) -> dict[str, float]:
        return {
            "tokens": self.tokens,
            "num_gpus": self.num_gpus,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "wall_hours": self.wall_hours,
            "gpu_hours": self.gpu_hours,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "dollars": self.dollars,
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
    )
