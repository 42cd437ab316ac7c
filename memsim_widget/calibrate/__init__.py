"""Any other transformers causal LM: parameters counted on the meta device, activations calibrated from traces.

A ``model_type`` no family in ``memsim_widget/families`` models is still estimated when transformers knows it:
:func:`calibrated_builder` returns a builder whose :class:`~memsim_widget.architecture.Architecture` lists every
parameter of ``AutoModelForCausalLM.from_config`` built on the meta device (:mod:`.params`), and carries in
``facts.calibration`` (``extra["calibration"]``) a :class:`SavedBytesSource` from which the engine reads plain fitted coefficients of the
saved bytes per block and outside the blocks (:mod:`.fit`), one fit per activation-relevant recipe (precision,
attention kernel, LoRA targets, checkpointing). The engine stays pure Python: torch and transformers are imported
here only, on the first estimate of such a model. Fits are cached per config (hash of the config and the
transformers version), in-process and, when ``MEMSIM_CALIBRATION_CACHE`` names a folder, on disk.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError

#: Fits made in this process: (config hash, recipe key) -> fit (plain data). Traces run only on a miss.
_FITS: dict[tuple[str, tuple], dict[str, Any]] = {}
_LOCK = threading.Lock()
#: How many fits this process traced (tests read it to check the cache).
TRACE_COUNT = {"fits": 0, "traces": 0}


def transformers_version() -> str | None:
    """transformers' version, or None when it or torch (which the meta build and the traces need) is missing."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        return None
    return str(transformers.__version__)


#: The shape of every model type transformers registers (``llama``, ``gpt-sw3``, ``qwen2_5_vl``).
_TYPE_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: A ``"model_type": "SomeConfig"`` (or tuple) entry of transformers' config mapping, in its source text.
_MAPPING_ENTRY = re.compile(r"[\"']([A-Za-z0-9][A-Za-z0-9_.-]*)[\"']\s*[:,]\s*[\"'][A-Za-z0-9_]*Config[\"']")


@functools.cache
def _listed_types() -> frozenset[str] | None:
    """Every model type named in transformers' auto-config mapping, read from its source files without
    importing transformers (which takes seconds, torch with it); None when the files are not where transformers
    4.x/5.x keep them (then the import decides). A superset is harmless: the import has the last word."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    auto = Path(spec.origin).parent / "models" / "auto"
    names: set[str] = set()
    for name in ("auto_mappings.py", "configuration_auto.py"):
        try:
            names.update(_MAPPING_ENTRY.findall((auto / name).read_text(encoding="utf-8")))
        except OSError:
            continue
    return frozenset(names) if len(names) > 50 else None


def maybe_known_to_transformers(model_type: str) -> bool:
    """False when ``model_type`` is certainly not one transformers knows (its shape, or its absence from the
    mapping's source text); answered without importing transformers."""
    if not _TYPE_SHAPE.fullmatch(model_type):
        return False
    listed = _listed_types()
    return listed is None or model_type in listed


def known_to_transformers(model_type: str) -> bool:
    """True if transformers is installed and has a config class for ``model_type`` (no network, no remote code).

    A type of another shape, or one absent from transformers' mapping source, is answered at once: refusing an
    unknown type never waits for the seconds-long import of transformers and torch."""
    if not maybe_known_to_transformers(model_type):
        return False
    if transformers_version() is None:
        return False
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


#: Bumped whenever what a fit measures or how changes, so a disk cache written before is not read.
FIT_VERSION = 3


def config_hash(config: Mapping[str, Any]) -> str:
    """The cache key of a config: its canonical JSON, the transformers version and the fit's version."""
    text = json.dumps(dict(config), sort_keys=True, default=str) + f"|{transformers_version()}|{FIT_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def calibrated_builder(model_type: str) -> Callable[[Mapping[str, Any]], Any] | None:
    """The builder for a model type transformers knows (None without transformers or for a type it does not)."""
    if not known_to_transformers(model_type):
        return None
    return build_calibrated


def build_calibrated(config: Mapping[str, Any]) -> Any:
    """The Architecture of ``config`` counted on the meta device, with a lazily fitted activation source."""
    from memsim_widget.architecture.types import Architecture

    from .params import build_meta, hf_config, param_groups, supports_sdpa

    mt = str(config["model_type"])
    t0 = time.perf_counter()
    try:
        cfg = hf_config(config)
    except Exception as exc:  # transformers' config validation raises many types
        raise ScenarioError(
            "model", f"transformers cannot build a {mt!r} config from it: {str(exc)[:300]}"
        ) from exc
    _refuse_structure(cfg, mt)
    try:
        model = build_meta(cfg)
    except Exception as exc:  # no causal-LM mapping (ValueError), or a model class that will not build
        raise ScenarioError(
            "model.model_type", f"{mt!r} has no causal-LM class transformers builds from this config "
            f"({str(exc)[:200]}); only causal LMs are calibrated from a trace",
        ) from exc  # fmt: skip
    groups, n_blocks, tied = param_groups(model, getattr(cfg, "num_hidden_layers", None))
    sdpa = supports_sdpa(model)
    cls_name = type(model).__name__
    del model
    h = int(_attr(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_attr(cfg, "num_attention_heads", "n_head", default=1))
    kv = int(_attr(cfg, "num_key_value_heads", default=heads) or heads)
    head_dim = int(_attr(cfg, "head_dim", default=0) or h // max(heads, 1))
    inter = int(_attr(cfg, "intermediate_size", "ffn_dim", "n_inner", default=0) or 4 * h)
    modules = {g.module for g in groups if g.module}
    learned = any(g.kind == "position" for g in groups)
    max_pos = _attr(cfg, "max_position_embeddings", "n_positions", default=None)
    source = SavedBytesSource(dict(config), mt)
    return Architecture(
        family="calibrated",
        model_type=mt,
        hidden_size=h,
        num_layers=n_blocks,
        num_heads=heads,
        num_kv_heads=kv if kv and heads % kv == 0 else heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=int(_attr(cfg, "vocab_size", default=0)),
        tied_embeddings=tied,
        params=groups,
        mlp_activation="swiglu" if {"gate_proj", "w1", "w3"} & modules else "gelu",
        norm="layernorm",
        position="learned" if learned else "rope",
        decoder_layers=n_blocks,
        max_seq_len=int(max_pos) if learned and max_pos else None,
        extra={
            "hf_class": "AutoModelForCausalLM",
            "calibration": source,
            # a class without an SDPA path runs eager when SDPA is asked for (as PreTrainedModel does)
            **(
                {}
                if sdpa
                else {"sdpa": False, "attention_note": f"{cls_name} has no SDPA path in transformers"}
            ),
            "meta_build_seconds": round(time.perf_counter() - t0, 3),
        },
    )


def _attr(cfg: Any, *names: str, default: Any = ...) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    if default is ...:
        raise ScenarioError(f"model.{names[0]}", "is required to calibrate this model type")
    return default


def _refuse_structure(cfg: Any, mt: str) -> None:
    """Refuse configs a two-block shrunk copy cannot stand for (blocks of several kinds, encoder-decoders)."""
    kinds = getattr(cfg, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(set(kinds)) > 1:
        raise ScenarioError(
            "model.layer_types", f"{mt!r} mixes block kinds {sorted(set(map(str, kinds)))}: a fit from "
            "shrunk copies of two and three blocks cannot stand for them, so it is not calibrated",
        )  # fmt: skip
    if getattr(cfg, "is_encoder_decoder", False):
        raise ScenarioError(
            "model.model_type", f"{mt!r} is an encoder-decoder: only causal LMs are calibrated"
        )


class SavedBytesSource:
    """Fitted saved bytes of one config, per recipe key; the engine calls :meth:`fit` and gets plain data.

    ``key`` = (precision, attention kernel, lora, checkpointing) where lora is None for full training or
    (targets, rank, alpha, adapter dtype). A fit is a dict of coefficient lists over ``fit.BASIS`` for
    ``per_layer`` / ``rest`` (saved at the start of backward, per block and outside the blocks), ``forward`` /
    ``backward`` (the phases' non-state peaks, per block and outside), plus ``residual`` (worst relative error on
    the held-out point), ``points`` and ``seconds``.
    """

    def __init__(self, config: dict[str, Any], model_type: str) -> None:
        self.config = config
        self.model_type = model_type
        self.hash = config_hash(config)

    def __repr__(self) -> str:
        return f"SavedBytesSource({self.model_type!r}, {self.hash})"

    def cached(self, key: tuple) -> bool:
        """Whether the fit for ``key`` is made already (in this process or on disk): estimating it traces nothing."""
        ck = (self.hash, key)
        if ck in _FITS:
            return True
        path = _disk_path(ck)
        return path is not None and path.is_file()

    def fit(self, key: tuple) -> dict[str, Any]:
        """The fit for ``key`` (traced on the first call, then cached; refused when the fit is poor)."""
        ck = (self.hash, key)
        with _LOCK:
            hit = _FITS.get(ck) or _disk_load(ck)
            if hit is None:
                try:
                    hit = _fit(self.config, key)
                except ScenarioError:
                    raise
                except Exception as exc:  # a shrunk copy transformers will not build or run: no number
                    raise ScenarioError(
                        "model.model_type", f"{self.model_type!r} could not be calibrated from traces of shrunk "
                        f"copies ({type(exc).__name__}: {str(exc)[:200]})",
                    ) from exc  # fmt: skip
                TRACE_COUNT["fits"] += 1
                _FITS[ck] = hit
                _disk_save(ck, hit)
            _FITS[ck] = hit
        if hit["residual"] > _max_residual():
            raise ScenarioError(
                "model.model_type", f"{self.model_type!r}: the activation fit misses a held-out trace by "
                f"{hit['residual']:.1%} (> {_max_residual():.0%}), so no number is given for it",
            )  # fmt: skip
        return hit


def _max_residual() -> float:
    from .fit import MAX_RESIDUAL

    return MAX_RESIDUAL


def _trace_kwargs(key: tuple) -> dict[str, Any]:
    precision, attention, lora, ckpt = key
    kw: dict[str, Any] = {"precision": precision, "attention": attention, "gradient_checkpointing": ckpt}
    if lora is not None:
        targets, rank, alpha, dtype = lora
        kw["lora"] = {
            "r": rank,
            "lora_alpha": alpha,
            "target_modules": "all-linear" if "all-linear" in targets else list(targets),
            "adapter_dtype": dtype,
        }
    return kw


def _fit(config: dict[str, Any], key: tuple) -> dict[str, Any]:
    """Trace the shrunk model at the fit points with 2 and 3 blocks, fit, and check the held-out point."""
    from .fit import FIT_BLOCKS, FIT_POINTS, HELD_OUT, HELD_OUT_BLOCKS, evaluate, lstsq, nonstate_profile

    t0 = time.perf_counter()
    lo, hi = FIT_BLOCKS
    kw = _trace_kwargs(key)
    amounts = ("saved", "forward", "backward", "blocks", "attention", "bottom")
    data: dict[int, list[dict[str, float]]] = {}  # bytes (ints) and the trace's seconds
    for n in FIT_BLOCKS:
        cfg = _shrunk(config, n)
        data[n] = [nonstate_profile(cfg, b, s, **kw) for b, s in FIT_POINTS]
        TRACE_COUNT["traces"] += len(FIT_POINTS)
    rows = [[f(b, s) for _, f in _basis()] for b, s in FIT_POINTS]
    out: dict[str, Any] = {}
    for a in amounts:
        if a in ("saved", "bottom"):
            # a block's bytes from the difference of two copies, neither of them the first block (which differs
            # under LoRA: nothing before it needs a gradient)
            per = lstsq(rows, [float(d2[a] - d1[a]) for d1, d2 in zip(data[lo], data[hi], strict=True)])
        else:
            # a peak of the step with every block's saved tensors alive (the loss, the top block's backward)
            # grows by one block's saved bytes per block; read from the larger copy, where the top block's
            # instant has overtaken the lower blocks' (not yet so with 2 blocks under LoRA: GPT-J, traced)
            per = out["saved"]["per_layer"]
        rest = lstsq(rows, [float(d[a]) for d in data[hi]])
        rest = [r - hi * p for r, p in zip(rest, per, strict=True)]
        out[a] = {"per_layer": per, "rest": rest}
    held = nonstate_profile(_shrunk(config, HELD_OUT_BLOCKS), *HELD_OUT, **kw)
    TRACE_COUNT["traces"] += 1
    errs = {}
    top = max(max(held[a] for a in amounts), 1)
    for a in amounts:
        pred = evaluate(out[a]["rest"], *HELD_OUT) + HELD_OUT_BLOCKS * evaluate(
            out[a]["per_layer"], *HELD_OUT
        )
        # relative to the held-out step's largest non-state amount: an instant far below the peak cannot move it
        errs[a] = (pred - held[a]) / top
    return {
        "per_layer": out["saved"]["per_layer"],
        "rest": out["saved"]["rest"],
        "forward": out["forward"],
        "backward": out["backward"],
        "blocks": out["blocks"],
        "attention": out["attention"],
        "bottom": out["bottom"],
        "basis": [label for label, _ in _basis()],
        "residual": max(abs(e) for e in errs.values()),
        "held_out": {"b": HELD_OUT[0], "s": HELD_OUT[1], "blocks": HELD_OUT_BLOCKS, "errors": errs},
        "points": [list(p) for p in FIT_POINTS],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _shrunk(config: dict[str, Any], blocks: int) -> dict[str, Any]:
    """The config cut to ``blocks`` blocks (every spelling of the layer count replaced), checked to build so."""
    from .params import hf_config, layer_key

    key = layer_key(hf_config(config))
    out = {k: v for k, v in config.items() if k not in (key, "num_hidden_layers")}
    out[key] = blocks
    if getattr(hf_config(out), "num_hidden_layers", None) != blocks:
        raise ScenarioError("model.num_hidden_layers", f"a {blocks}-block copy of this config does not build")
    return out


def _basis() -> tuple:
    from .fit import BASIS

    return BASIS


def _disk_path(ck: tuple[str, tuple]) -> Path | None:
    folder = os.environ.get("MEMSIM_CALIBRATION_CACHE")
    if not folder:
        return None
    name = hashlib.sha256(json.dumps([ck[0], list(map(str, ck[1]))]).encode()).hexdigest()[:24]
    return Path(folder).expanduser() / f"{name}.json"


def _disk_load(ck: tuple[str, tuple]) -> dict[str, Any] | None:
    path = _disk_path(ck)
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _disk_save(ck: tuple[str, tuple], fit: dict[str, Any]) -> None:
    path = _disk_path(ck)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fit))
    except OSError:
        pass
