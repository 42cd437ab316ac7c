"""Two to four scenarios side by side: their memory per category, step times, verdicts, and which fields differ.

``compare([...])`` takes scenarios, scenario dicts or estimates and returns a ``Comparison``: ``.frame`` (long:
one row per scenario and memory category, with each scenario's headline numbers), ``.totals`` (one row per
scenario), ``.differences`` (the scenario fields whose values are not all equal) and ``.chart()``
(``charts.comparison``). The numbers are the estimates' own: nothing is recomputed differently here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memsim_widget.charts import gpu_label, model_label
from memsim_widget.engine.core import estimate as run_estimate
from memsim_widget.engine.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.scenario import Scenario, check_headroom
from memsim_widget.units import GiB, fmt_bytes

if TYPE_CHECKING:
    import altair as alt
    import pandas as pd

#: How many scenarios one comparison holds.
MIN_SCENARIOS, MAX_SCENARIOS = 2, 4
#: Differing fields a default name spells out (``method=lora, lora.rank=8``).
NAME_FIELDS = 2

FRAME_COLUMNS = [
    "scenario", "category", "bytes", "gib", "share", "device_total_bytes", "device_total_gib",
    "gpu_memory_bytes", "fits", "verdict", "step_time_s", "tokens_per_second_per_gpu", "mfu",
]  # fmt: skip
TOTALS_COLUMNS = [
    "scenario", "model", "gpu", "device_total_bytes", "device_total_gib", "peak_allocated_bytes",
    "gpu_memory_bytes", "fits", "verdict", "peak_phase", "step_time_s", "tokens_per_second_per_gpu", "mfu",
]  # fmt: skip


def flat_fields(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A scenario dict as dotted fields, nested sections included (``parallel.tp``, ``model.hidden_size``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(flat_fields(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def value_text(field: str, value: Any) -> str:
    """A field's value in a few characters, as names and tables show it."""
    if field == "model" or field == "gpu":
        return (model_label if field == "model" else gpu_label)(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return "+".join(str(v) for v in value) or "none"
    return "none" if value is None else str(value)


def field_differences(scenarios: Sequence[Scenario], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The dotted fields whose values are not all equal, in scenario-field order: field -> name -> value."""
    flats = [flat_fields(s.to_dict()) for s in scenarios]
    fields = list(dict.fromkeys(k for f in flats for k in f))
    out = {}
    for field in fields:
        values = [f.get(field) for f in flats]
        if any(v != values[0] for v in values[1:]):
            out[field] = dict(zip(names, values, strict=True))
    return out


def default_names(scenarios: Sequence[Scenario]) -> list[str]:
    """Names from what differs (``method=lora``), ``scenario N`` when nothing does or two names collide."""
    diffs = field_differences(scenarios, [str(i) for i in range(len(scenarios))])
    fields = list(diffs)[:NAME_FIELDS]
    names = [
        ", ".join(f"{f}={value_text(f, diffs[f][str(i)])}" for f in fields) for i in range(len(scenarios))
    ]
    if not fields or len(set(names)) < len(names):
        return [f"scenario {i + 1}" for i in range(len(scenarios))]
    return names


def _as_estimate(item: Any, index: int) -> Estimate:
    """One input as an estimate: an ``Estimate`` as is, a ``Scenario`` or scenario dict estimated."""
    if isinstance(item, Estimate):
        return item
    if isinstance(item, Scenario | Mapping):
        try:
            return run_estimate(item if isinstance(item, Scenario) else Scenario.from_dict(item))
        except ScenarioError as exc:
            raise ScenarioError(f"scenarios[{index}].{exc.field}", exc.message) from None
    raise ScenarioError(
        f"scenarios[{index}]",
        f"must be a Scenario, a scenario dict or an Estimate, got {type(item).__name__}",
    )


def _check_names(names: Any, count: int) -> list[str]:
    """``count`` distinct non-empty strings."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ScenarioError("names", f"must be a list of {count} strings, got {type(names).__name__}")
    names = list(names)
    if len(names) != count:
        raise ScenarioError("names", f"must name each of the {count} scenarios, got {len(names)} names")
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise ScenarioError("names", "each name must be a non-empty string")
    if len(set(names)) < count:
        raise ScenarioError("names", f"must be distinct, got {names}")
    return names


def compare(
    scenarios: Sequence[Scenario | Mapping[str, Any] | Estimate],
    names: Sequence[str] | None = None,
    *,
    headroom: float = DEFAULT_HEADROOM,
) -> Comparison:
    """Compare 2 to 4 scenarios (or scenario dicts, or estimates); ``names`` default to what differs."""
    if isinstance(scenarios, Scenario | Estimate | Mapping | str) or not isinstance(scenarios, Sequence):
        raise ScenarioError("scenarios", f"must be a list of {MIN_SCENARIOS} to {MAX_SCENARIOS} scenarios")
    if not MIN_SCENARIOS <= len(scenarios) <= MAX_SCENARIOS:
        raise ScenarioError(
            "scenarios", f"compare takes {MIN_SCENARIOS} to {MAX_SCENARIOS} scenarios, got {len(scenarios)}"
        )
    ests = tuple(_as_estimate(item, i) for i, item in enumerate(scenarios))
    if names is None:
        names = default_names([e.scenario for e in ests])
    return Comparison(ests, tuple(_check_names(names, len(ests))), check_headroom(headroom))


@dataclass(frozen=True)
class Comparison:
    """Estimates side by side under one name each, with the verdicts taken at one ``headroom``."""

    estimates: tuple[Estimate, ...]
    names: tuple[str, ...]
    headroom: float = DEFAULT_HEADROOM

    @property
    def differences(self) -> dict[str, dict[str, Any]]:
        """The scenario fields whose values differ: dotted field -> scenario name -> value (a plain property,
        cheap for a few scenarios: pyright cannot match a ``cached_property`` to ``Compared``'s property)."""
        return field_differences([e.scenario for e in self.estimates], self.names)

    def headline(self, name: str, est: Estimate) -> dict[str, Any]:
        """One scenario's headline numbers (the ``totals`` row)."""
        return {
            "scenario": name,
            "model": model_label(est.scenario.model),
            "gpu": est.gpu.name,
            "device_total_bytes": est.device_total_bytes,
            "device_total_gib": est.device_total_bytes / GiB,
            "peak_allocated_bytes": est.peak_allocated_bytes,
            "gpu_memory_bytes": est.gpu.memory_bytes,
            "fits": est.fits(headroom=self.headroom),
            "verdict": est.verdict(self.headroom),
            "peak_phase": est.peak_phase,
            "step_time_s": est.step_time_s,
            "tokens_per_second_per_gpu": est.tokens_per_second_per_gpu,
            "mfu": est.mfu,
        }

    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows: one per scenario and memory category (worst rank at its peak), headline numbers repeated."""
        out = []
        for name, est in zip(self.names, self.estimates, strict=True):
            head = self.headline(name, est)
            total = est.device_total_bytes
            for category, nbytes in est.components().items():
                out.append(
                    {
                        **{k: head[k] for k in FRAME_COLUMNS if k in head},
                        "category": category,
                        "bytes": nbytes,
                        "gib": nbytes / GiB,
                        "share": nbytes / total if total else 0.0,
                    }
                )
        return out

    @property
    def frame(self) -> pd.DataFrame:
        """Memory per scenario and category as a long pandas DataFrame (``FRAME_COLUMNS``)."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=FRAME_COLUMNS)

    @property
    def totals(self) -> pd.DataFrame:
        """One row per scenario: peak, verdict, step time, tokens/s and MFU (``TOTALS_COLUMNS``)."""
        import pandas as pd

        rows = [self.headline(n, e) for n, e in zip(self.names, self.estimates, strict=True)]
        return pd.DataFrame(rows, columns=TOTALS_COLUMNS)

    def spec(self) -> dict[str, Any]:
        """The Vega-Lite spec of ``chart`` (``charts.comparison.compare_spec``)."""
        from memsim_widget.charts.comparison import compare_spec

        return compare_spec(self)

    def chart(self) -> alt.VConcatChart:
        """Altair chart: stacked memory bars side by side against the GPU capacity, then the step times."""
        from memsim_widget.charts import to_altair

        return to_altair(self.spec())  # type: ignore[return-value]

    def _lines(self) -> list[str]:
        """The comparison in a few lines of text (``__repr__``)."""
        lines = [f"Comparison of {len(self.names)} scenarios (headroom {self.headroom:.0%}):"]
        for name, est in zip(self.names, self.estimates, strict=True):
            lines.append(
                f"  {name}: {fmt_bytes(est.device_total_bytes)} per GPU on {est.gpu.name}, "
                f"{est.verdict(self.headroom)}; {est.step_time_s:.3g} s/step, "
                f"{est.tokens_per_second_per_gpu:,.0f} tokens/s/GPU, MFU {est.mfu:.1%}"
            )
        diffs = ", ".join(self.differences) or "none (the scenarios are the same)"
        return [*lines, f"  differs: {diffs}"]

    def __repr__(self) -> str:
        return "\n".join(self._lines())

    def _repr_html_(self) -> str:
        """A table: headline numbers, then each differing field, one column per scenario."""
        from html import escape

        head = "".join(f"<th>{escape(n)}</th>" for n in self.names)
        heads = [self.headline(n, e) for n, e in zip(self.names, self.estimates, strict=True)]
        body = []
        for label, key, fmt in (
            ("peak per GPU (nvidia-smi)", "device_total_bytes", fmt_bytes),
            ("verdict", "verdict", str),
            ("step time (s)", "step_time_s", lambda v: f"{v:.3g}"),
            ("tokens/s per GPU", "tokens_per_second_per_gpu", lambda v: f"{v:,.0f}"),
            ("MFU", "mfu", lambda v: f"{v:.1%}"),
        ):
            cells = "".join(f"<td>{escape(fmt(h[key]))}</td>" for h in heads)
            body.append(f"<tr><th>{escape(label)}</th>{cells}</tr>")
        for field, values in self.differences.items():
            cells = "".join(f"<td><b>{escape(value_text(field, v))}</b></td>" for v in values.values())
            body.append(f"<tr><th>{escape(field)}</th>{cells}</tr>")
        return f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
