"""UNTESTED ON GPU (prepared without a device; issue 22 item 5a). The caching allocator's segments on a real GPU
against the replay of the CPU trace, segment by segment.

On the GPU (``--out-dir``): each scenario (``SNAPSHOTS``: scenarios of ``benchmarks/gpu_measure.py``, one of them
also under ``expandable_segments:True``) trains three real steps through ``memsim_widget.measure.train_steps`` in
a subprocess of its own; ``torch.cuda.memory._record_memory_history`` (a private PyTorch API, recording without
stack frames to stay fast) runs through step 3, and ``torch.cuda.memory._snapshot()`` is taken right after step
3's optimizer step. What is kept, one JSON file per scenario (``<name>.json``, a few kB): every segment (size,
stream, pool, allocated / active / requested bytes, expandable), the peak and current reserved and allocated
counters, and step 3's allocator events counted (alloc, free, segment_alloc / segment_free sizes, map / unmap,
oom).

On CPU (``--compare DIR``): each summary's scenario is traced on fake tensors (``memsim_widget.trace``),
its allocations and frees replayed through ``engine/counters/allocator.py`` as ``memsim trace`` replays them
(``trace/replay.py``: cuBLAS workspaces added, the scenario's allocator settings), and the replay's segments at
the end of the trace are set beside the GPU's per (stream, pool), largest first: equal sizes, and the peak
reserved of both. The trace runs the GPU run's three steps at the same sequence lengths (``lengths`` in the
summary), so both end right after step 3's optimizer step. GPU streams are CUDA stream handles; a single-GPU
step runs on the default stream (0), the replay's stream 0.

Run:
    python benchmarks/gpu_snapshots.py --out-dir data/measured/snapshots        # GPU, ~2 minutes
    python benchmarks/gpu_snapshots.py --compare data/measured/snapshots        # CPU, no GPU needed
    python benchmarks/gpu_snapshots.py --cpu-smoke --out-dir /tmp/s             # the logic on CPU: tiny model,
                                               # a snapshot built from the replay itself, then compared
Without CUDA (and without --cpu-smoke / --compare) it exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_measure as gm  # noqa: E402

from memsim_widget.scenario import Scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
BUDGET_SECONDS = 150
EXPANDABLE = "expandable_segments:True"


@dataclass(frozen=True)
class Snap:
    """One snapshot: a gpu_measure measurement, under an allocator setting (PYTORCH_CUDA_ALLOC_CONF)."""

    measurement: str
    alloc_conf: str = ""

    @property
    def name(self) -> str:
        return self.measurement + ("-expandable" if self.alloc_conf == EXPANDABLE else "")

    def measured(self) -> gm.Measurement:
        if self.measurement in _SMOKE:
            return _SMOKE[self.measurement]
        (m,) = [m for m in gm.MEASUREMENTS if m.name == self.measurement]
        return m

    def scenario(self) -> Scenario:
        """The scenario the engine and the trace read (the allocator setting as its ``allocator_conf``)."""
        d = dict(self.measured().scenario)
        if self.alloc_conf:
            d["allocator_conf"] = self.alloc_conf
        return Scenario.from_dict(d)


#: Each default-allocator scenario next to its expandable-segments twin first: the most telling pairs.
SNAPSHOTS: tuple[Snap, ...] = (
    Snap("llama1b-bf16"), Snap("llama1b-bf16", EXPANDABLE), Snap("qwen05b-bf16-longest"),
    Snap("qwen05b-bf16-longest", EXPANDABLE), Snap("llama1b-bf16-ckpt"), Snap("llama1b-lora"), Snap("qwen05b-bf16"),
    Snap("gpt2m-amp-eager"), Snap("llama1b-bf16-fused"), Snap("qwen3-06b-bf16"), Snap("phi15-bf16"),
)  # fmt: skip

_TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip
_TINY_SC = {"model": _TINY, "gpu": "h100-sxm-80gb", "precision": "fp32", "micro_batch_size": 2, "seq_len": 64}
_SMOKE = {
    "smoke-tiny": gm.Measurement("smoke-tiny", _TINY_SC),
    "smoke-tiny-longest": gm.Measurement(
        "smoke-tiny-longest", {**_TINY_SC, "padding": "longest"}, lengths=(16, 64, 40)
    ),
}
SMOKE_SNAPSHOTS = (Snap("smoke-tiny"), Snap("smoke-tiny-longest", EXPANDABLE))


# ----- the summary of a snapshot ------------------------------------------------------------------------------
def summarise_segments(segments: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """PyTorch snapshot segments, compact: size, stream, pool, allocated / active / requested bytes."""
    out = [
        {"size": int(s["total_size"]), "stream": int(s.get("stream", 0)), "pool": str(s.get("segment_type", "")),
         "allocated": int(s.get("allocated_size", 0)), "active": int(s.get("active_size", 0)),
         "requested": int(s.get("requested_size", 0)), "expandable": bool(s.get("is_expandable", False))}
        for s in segments
    ]  # fmt: skip
    return sorted(out, key=lambda s: (s["stream"], s["pool"], -s["size"], -s["allocated"]))


def summarise_events(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Step 3's allocator events: counts per action, and the sizes of the segments made and released."""
    counts: dict[str, int] = defaultdict(int)
    sizes: dict[str, list[int]] = defaultdict(list)
    for e in events:
        action = str(e.get("action"))
        counts[action] += 1
        if action.startswith("segment_"):
            sizes[action].append(int(e.get("size", 0)))
    return {"counts": dict(counts), "segment_sizes": dict(sizes)}


def summary(
    snap: Snap, snapshot: dict[str, Any], counters: dict[str, int], env: dict[str, str]
) -> dict[str, Any]:
    """The JSON kept for one scenario."""
    traces = snapshot.get("device_traces") or [[]]
    return {"name": snap.name, "measurement": snap.measurement, "alloc_conf": snap.alloc_conf,
            "scenario": snap.scenario().to_dict(), "env": env, **counters,
            "segments": summarise_segments(snapshot.get("segments", [])), "step3_events": summarise_events(traces[0])}  # fmt: skip


# ----- on the GPU (the child) ---------------------------------------------------------------------------------
def take(snap: Snap, device: str) -> dict[str, Any]:
    """Three steps of the snapshot's scenario; the summary of the allocator right after step 3."""
    import torch

    from memsim_widget import measure

    m = snap.measured()
    sc = Scenario.from_dict(m.scenario)
    out: dict[str, Any] = {}

    def on_phase(step: int, phase: str) -> None:
        if phase != "optimizer step" or device != "cuda":
            return
        if step == 2:
            try:  # no stack frames: cheap enough not to slow step 3
                torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
            except (TypeError, RuntimeError, ValueError):  # another signature or combination: the defaults
                torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        elif step == 3:
            torch.cuda.synchronize()
            out["snapshot"] = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            out["counters"] = {
                "peak_reserved": int(torch.cuda.max_memory_reserved()),
                "peak_allocated": int(torch.cuda.max_memory_allocated()),
                "reserved_at_snapshot": int(torch.cuda.memory_reserved()),
                "allocated_at_snapshot": int(torch.cuda.memory_allocated()),
            }

    lengths = steps(m)
    measure.train_steps(sc, lengths, device, on_phase)
    if device != "cuda":  # --cpu-smoke: the snapshot a GPU would give, built from the replay of the CPU trace
        rep = replayed(snap.scenario(), lengths)
        out["snapshot"] = {"segments": rep["segments_torch"], "device_traces": [[]]}
        out["counters"] = {"peak_reserved": rep["peak_reserved"], "peak_allocated": rep["peak_allocated"],
                           "reserved_at_snapshot": rep["reserved_at_end"], "allocated_at_snapshot": rep["allocated_at_end"]}  # fmt: skip
    env = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (smoke: snapshot from the replay)",
           "torch": torch.__version__, "alloc_conf_env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}  # fmt: skip
    return {**summary(snap, out["snapshot"], out["counters"], env), "lengths": lengths}


def steps(m: gm.Measurement) -> list[int]:
    """The three steps' sequence lengths (a variable-length measurement's first three, its longest among them)."""
    lengths = m.step_lengths()[:3]
    assert len(lengths) == 3 and max(lengths) == max(m.step_lengths()), m.name
    return lengths


# ----- on CPU: the replay of the trace --------------------------------------------------------------------------
def replayed(sc: Scenario, lengths: list[int]) -> dict[str, Any]:
    """The CPU trace of ``sc`` over the GPU run's steps (one per entry of ``lengths``) replayed through the engine's
    allocator: its segments at the end (in the snapshot's own format, ``segments_torch``) and its counters."""
    from memsim_widget.catalog.models import resolve_model_config
    from memsim_widget.engine.counters.allocator import CachingAllocator
    from memsim_widget.trace.hf import trace_hf
    from memsim_widget.trace.replay import _prepared
    from memsim_widget.trace.traceable import check_traceable, trace_kwargs

    check_traceable(sc)
    result = trace_hf(dict(resolve_model_config(sc.model)), **{**trace_kwargs(sc), "lengths": tuple(lengths)})
    events, _outside, conf, _memory = _prepared(result.tracker, sc, None)
    a = CachingAllocator(None, conf)
    _n, failure = a.run(events)
    assert failure is None, "an unlimited replay does not fail"
    segs: dict[int, dict[str, Any]] = {}
    for b in [*a.live.values(), *a.free_blocks.values()]:
        stream, small = b.key
        s = segs.setdefault(b.seg, {"total_size": 0, "stream": stream, "segment_type": "small" if small else "large",
                                    "allocated_size": 0, "active_size": 0, "requested_size": 0,
                                    "is_expandable": b.seg < 0})  # fmt: skip
        if not b.mapped:
            continue
        s["total_size"] += b.size
        if b.allocated:
            s["allocated_size"] += b.size
            s["active_size"] += b.size
            s["requested_size"] += b.req
    return {"segments_torch": [s for s in segs.values() if s["total_size"]], "peak_reserved": a.peak_reserved,
            "peak_allocated": a.peak_allocated, "reserved_at_end": a.reserved, "allocated_at_end": a.allocated}  # fmt: skip


def compare(gpu: dict[str, Any], replay: dict[str, Any]) -> dict[str, Any]:
    """Segment by segment, per (stream, pool), largest first: the GPU's summary against the replay's."""
    mine = summarise_segments(replay["segments_torch"])
    groups: dict[tuple[int, str], tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for s in gpu["segments"]:
        groups[(s["stream"], s["pool"])][0].append(s["size"])
    for s in mine:
        groups[(s["stream"], s["pool"])][1].append(s["size"])
    per_group, equal, total = [], 0, 0
    for (stream, pool), (g, r) in sorted(groups.items()):
        g, r = sorted(g, reverse=True), sorted(r, reverse=True)
        pairs = [
            (g[i] if i < len(g) else None, r[i] if i < len(r) else None) for i in range(max(len(g), len(r)))
        ]
        equal += sum(a == b for a, b in pairs)
        total += len(pairs)
        per_group.append({"stream": stream, "pool": pool, "gpu": g, "replay": r,
                          "equal": sum(a == b for a, b in pairs), "pairs": len(pairs)})  # fmt: skip
    pr, rr = gpu["peak_reserved"], replay["peak_reserved"]
    return {"name": gpu["name"], "segments_gpu": len(gpu["segments"]), "segments_replay": len(mine),
            "segments_equal": equal, "segments_paired": total, "groups": per_group,
            "reserved_gpu": gpu["reserved_at_snapshot"], "reserved_replay": replay["reserved_at_end"],
            "peak_reserved_gpu": pr, "peak_reserved_replay": rr,
            "peak_reserved_error": (rr - pr) / pr if pr else None}  # fmt: skip


def compare_dir(path: Path) -> list[dict[str, Any]]:
    """Every summary of ``path`` against the replay of its scenario's CPU trace; printed as it goes."""
    out = []
    for f in sorted(path.glob("*.json")):
        gpu = json.loads(f.read_text())
        c = compare(gpu, replayed(Scenario.from_dict(gpu["scenario"]), gpu["lengths"]))
        out.append(c)
        err = c["peak_reserved_error"]
        print(f"{c['name']:<30} segments {c['segments_equal']}/{c['segments_paired']} equal "
              f"(gpu {c['segments_gpu']}, replay {c['segments_replay']}); peak reserved gpu "
              f"{c['peak_reserved_gpu'] / GiB:.3f} replay {c['peak_reserved_replay'] / GiB:.3f} GiB"
              + ("" if err is None else f" ({err:+.2%})"), flush=True)  # fmt: skip
    return out


# ----- the parent -----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "data" / "measured" / "snapshots")
    ap.add_argument("--only", nargs="*", help="snapshot names")
    ap.add_argument("--budget", type=float, default=BUDGET_SECONDS)
    ap.add_argument("--compare", type=Path, metavar="DIR", help="compare DIR's summaries with the CPU replay")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    pool = SMOKE_SNAPSHOTS if args.cpu_smoke else SNAPSHOTS
    chosen = [s for s in pool if not args.only or s.name in args.only]
    if args.list:
        for s in chosen:
            print(f"{s.name:<32}{s.alloc_conf or '(default allocator)'}")
        return 0
    if args.compare:
        res = compare_dir(args.compare)
        (args.compare / "compare.jsonl").write_text("".join(json.dumps(r) + "\n" for r in res))
        return 0 if res else 1
    device = "cpu" if args.cpu_smoke else "cuda"
    if not args.cpu_smoke and gm.require_cuda():
        print(f"gpu_snapshots: {gm.require_cuda()}", file=sys.stderr)
        return 2
    if args.child:
        (snap,) = [s for s in pool if s.name == args.child]
        print(json.dumps(take(snap, device)))
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    start, n = time.monotonic(), 0
    for s in chosen:
        left = args.budget - (time.monotonic() - start)
        if left < 20:
            print(f"{s.name}: skipped, {left:.0f} s left", flush=True)
            continue
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": s.alloc_conf} if s.alloc_conf else None
        cmd = [sys.executable, __file__, "--child", s.name] + (["--cpu-smoke"] if args.cpu_smoke else [])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=ROOT, env=env)
        except subprocess.TimeoutExpired:
            print(f"{s.name}: timed out", flush=True)
            continue
        if p.returncode or not p.stdout.strip():
            print(f"{s.name}: failed\n{p.stderr[-2000:]}", flush=True)
            continue
        data = json.loads(p.stdout.strip().splitlines()[-1])
        (args.out_dir / f"{s.name}.json").write_text(json.dumps(data, indent=1, sort_keys=True))
        n += 1
        print(f"{s.name:<32} {len(data['segments'])} segments, peak reserved {data['peak_reserved'] / GiB:.3f} GiB "
              f"({time.monotonic() - start:.0f} s)", flush=True)  # fmt: skip
    print(f"wrote {n} summaries to {args.out_dir}", flush=True)
    if (
        args.cpu_smoke
    ):  # the CPU half too: the smoke's snapshots are the replay's own, so every segment is equal
        compare_dir(args.out_dir)
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
