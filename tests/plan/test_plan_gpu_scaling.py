"""Memory per GPU as data parallelism grows, per ZeRO stage: equal to ``estimate`` and shaped as ZeRO says."""

from __future__ import annotations

import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.plan.gpu_scaling import gpu_scaling, gpu_scaling_spec
from memsim_widget.scenario import Scenario

GiB = 1024**3
SC = Scenario.from_dict(
    {"model": "llama-3.1-70b", "gpu": "h100-sxm-80gb", "seq_len": 4096, "activation_checkpointing": "full",
     "parallel": {"tp": 8}}
)  # fmt: skip


@pytest.fixture(scope="module")
def frame():
    return gpu_scaling(SC, (8, 512))


def test_every_point_is_the_estimate_of_that_layout(frame):
    for r in frame.itertuples():
        est = estimate(SC.replace(parallel={"dp": int(r.dp), "zero": int(r.zero)}))
        assert r.device_total_gib * GiB == pytest.approx(est.device_total_bytes, abs=1)
        assert r.peak_allocated_gib * GiB == pytest.approx(est.peak_allocated_bytes, abs=1)
        assert r.fits == est.fits()


def test_counts_are_multiples_of_the_kept_layout_and_one_replica_is_never_sharded(frame):
    assert set(frame.num_gpus) == {8, 16, 32, 64, 128, 256, 512}
    assert (frame.num_gpus == frame.dp * 8).all()
    assert set(frame[frame.dp == 1].zero) == {0}


def test_plain_data_parallelism_is_flat_and_sharding_falls_with_more_replicas(frame):
    z0 = frame[(frame.zero == 0) & (frame.dp > 1)].device_total_gib
    assert z0.max() == pytest.approx(z0.min())
    for z in (1, 2, 3):
        line = frame[frame.zero == z].sort_values("dp").device_total_gib.to_numpy()
        assert (line[1:] <= line[:-1]).all()
    at64 = frame[frame.num_gpus == 64].set_index("zero").device_total_gib
    assert at64[3] < at64[2] < at64[1] < at64[0]


def test_bad_input_names_the_field():
    with pytest.raises(ScenarioError) as e:
        gpu_scaling(SC, (1, 4))
    assert e.value.field == "gpus"
    with pytest.raises(ScenarioError) as e:
        gpu_scaling(SC, 64, zero=(5,))
    assert e.value.field == "zero"


def test_spec_has_one_line_per_stage_and_the_card():
    spec = gpu_scaling_spec(SC, (8, 64))
    values = spec["layer"][-1]["data"]["values"]
    assert {v["stage"] for v in values} == {"ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"}
    assert any("GPU capacity" in str(layer) for layer in spec["layer"][:-1])
