"""One simulated rank's result: its moments, the peak among them and the memory outside the allocator."""

from __future__ import annotations

from memsim_widget.engine.context import Stage
from memsim_widget.engine.items import CATEGORIES, Item
from memsim_widget.engine.rl.objectives import phase_of
from memsim_widget.engine.step.timeline import Moment
from memsim_widget.fast_dataclass import dataclass


@dataclass(frozen=True)
class RankEstimate:
    """One rank (one per pipeline stage; ranks within a stage are symmetric)."""

    stage: Stage
    moments: tuple[Moment, ...]
    peak: Moment
    reserved: Item
    device: tuple[Item, ...]
    host: tuple[Item, ...]
    step1_peak_allocated_bytes: int
    params_local: int
    trainable_local: int
    #: (counter, (low, high)) uncertainty bands of the three GPU counters (engine/counters/overhead.counter_bands)
    bands: tuple[tuple[str, tuple[int, int]], ...] = ()

    @property
    def label(self) -> str:
        return self.stage.label

    @property
    def peak_phase(self) -> str:
        return self.peak.name

    @property
    def peak_tensor_bytes(self) -> int:
        return max(m.tensor_bytes for m in self.moments)

    @property
    def peak_allocated_bytes(self) -> int:
        return self.peak.allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self.peak_allocated_bytes + self.reserved.bytes

    @property
    def device_total_bytes(self) -> int:
        return self.peak_reserved_bytes + sum(i.bytes for i in self.device)

    @property
    def host_bytes(self) -> int:
        return sum(i.bytes for i in self.host)

    @property
    def items(self) -> tuple[Item, ...]:
        """Everything on the device at the peak, including reserved and outside-PyTorch memory."""
        return self.peak.items + (self.reserved,) + self.device

    def counter(self, name: str) -> int:
        """This rank's figure of one headline counter (a key of ``engine/estimate.COUNTERS``)."""
        return int(getattr(self, name))

    def components(self) -> dict[str, int]:
        """Bytes per category at the peak (device total split; temporaries kept apart)."""
        out: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        for i in self.items:
            out[i.category] += i.allocated_bytes if i.level.allocated else i.bytes
        return out

    def moment_totals(self) -> dict[str, int]:
        return {m.name: m.allocated_bytes for m in self.moments}

    def phase_peaks(self) -> dict[str, Moment]:
        """The highest moment of each phase (``training``, and ``rollout`` for GRPO/PPO): the rank's peak is
        the larger of the two (``engine/rl/objectives.phase_of``)."""
        out: dict[str, Moment] = {}
        for m in self.moments:
            p = phase_of(m.name)
            if p not in out or m.allocated_bytes > out[p].allocated_bytes:
                out[p] = m
        return out

    def uncertainty(self) -> dict[str, dict[str, int]]:
        """Low and high bytes per GPU counter (what runs of this configuration can plausibly show)."""
        return {name: {"low": lo, "high": hi} for name, (lo, hi) in self.bands}
