"""Compiled steps: the engine's allocation stream replayed against the fake-tensor trace of the same compiled step,
replayed the same way (docs/allocator.md, "Compiled steps").

For each case of ``COMPILED_CASES`` (tests/data/fidelity_cases.py) that the engine's traced compiled rule covers
(``engine/activations/compiled.compiled_rule_applies``; the activation-budget cases are left out: the engine keeps
the default budget's figure there): the compiled trace's peak reserved and allocated (its two compiled steps
replayed), the engine stream's (``alloc_stream.rank_stream`` + ``replay_stream``) also without the CUDA-only scratch
a CPU trace cannot see (``rank_stream(traced_only=True)``: flash attention's fp32 dq accumulator), and the fitted
rule's reserved (``reserved_model: fitted``, the default of the compiled steps ``replayable.compiled_stream_held``
does not hold): ``tests/data/stream_vs_trace.figures``.
Each case traces in a fresh interpreter (tests/trace/test_trace_compiled.py says why). Nothing is fitted.

Run: python benchmarks/allocator_replay_compiled.py [-k TEXT ...] [--inductor-passes]   (20 s to 2 minutes a case on
one CPU core; ``--inductor-passes``: the traces made under ``trace/compiled.inductor_passes``, the order of the
compiled loss backward the stream follows: docs/allocator.md)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from fidelity_cases import COMPILED_CASES  # noqa: E402
from stream_vs_trace import compiled_figures  # noqa: E402  (the comparison the tests hold, written once)


def cases() -> list[tuple[str, dict[str, Any]]]:
    """The compiled cases the traced rule covers, at torch's default activation memory budget."""
    from memsim_widget.catalog.models import resolve_architecture
    from memsim_widget.engine.activations.compiled import compiled_rule_applies
    from memsim_widget.scenario import Scenario

    out = []
    for name, d in COMPILED_CASES:
        sc = Scenario.from_dict(d)
        if "budget" not in name and compiled_rule_applies(sc, resolve_architecture(sc.model)):
            out.append((name, d))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", nargs="*", default=[""], help="only cases whose name holds one of these texts")
    ap.add_argument(
        "--inductor-passes", action="store_true", help="trace under trace/compiled.inductor_passes"
    )
    args = ap.parse_args()
    for name, _ in cases():
        if not any(k in name for k in args.k):
            continue
        r = compiled_figures(name, args.inductor_passes, timeout=None)
        tr = int(r["trace"])
        print(
            f"{name:60s} reserved trace {tr:,} stream {int(r['stream']):,} ({int(r['stream']) / tr - 1:+.2%}, at "
            f"{r['at']}; without CUDA-only scratch {int(r['stream_traced_only']) / tr - 1:+.2%}), fitted "
            f"{int(r['fitted']) / tr - 1:+.2%}; allocated trace {int(r['trace_allocated']):,} "
            f"stream {int(r['stream_allocated']):,} (without CUDA-only scratch "
            f"{int(r['stream_traced_only_allocated']) / int(r['trace_allocated']) - 1:+.2%})",
            flush=True,
        )


if __name__ == "__main__":
    main()
