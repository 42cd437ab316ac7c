"""Trace training steps of Hugging Face transformers models built from config dicts (never downloads)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from memsim_widget.architecture.vision import PROJECTOR_MODULES, VISION_MODULES

from .float8 import import_torchao_quietly
from .run import TraceResult, drop_labels, trace_training
from .torch_recipe import precision_dtypes

#: transformers' torchao quantizer and peft's LoRA dispatch import torchao whenever it is installed (scripts/dev
#: installs it for the float8 traces): import it first, quietly, so no trace prints its CPU-only warnings.
import_torchao_quietly()

SEQ2SEQ = ("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian")
#: Multimodal models with their own input recipe: CLIP (image-text pairs, contrastive loss) and LLaVA.
VISION_LANGUAGE = ("clip", "llava", "gemma3", *("qwen2_vl", "qwen2_5_vl", "llava_next"), "llama4")
#: memsim's own model keys (the image size the processor sees), not transformers config keys.
MEMSIM_MODEL_KEYS = ("image_size", "min_pixels", "max_pixels")


def _family(model_type: str) -> str:
    """Which head/input recipe a model type uses: decoder, bert, vit or seq2seq."""
    if model_type in (
        "bert",
        "roberta",
        "xlm-roberta",
        "camembert",
        "distilbert",
        "albert",
        "electra",
        "deberta",
        "deberta-v2",
        "modernbert",
    ):
        return "bert"
    if model_type in ("vit", "deit", "beit"):
        return "vit"
    if model_type in SEQ2SEQ:
        return "seq2seq"
    if model_type in VISION_LANGUAGE:
        return model_type
    return "decoder"


def build_hf_config(config: dict[str, Any], attention: str) -> Any:
    """An HF config object from a dict holding ``model_type`` (plus overrides)."""
    from transformers import AutoConfig

    kw = dict(config)
    model_type = kw.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = attention
    return cfg


#: Model types without attention layers (state-space models): built with ``attn_implementation="eager"``.
NO_ATTENTION = frozenset({"mamba", "mamba2"})


def build_hf_model(cfg: Any, dtype: torch.dtype, attention: str) -> torch.nn.Module:
    """Instantiate the training head for ``cfg`` with weights in ``dtype`` (call inside FakeTensorMode).

    On the meta device (where the fake traces build, to swap in fake tensors later) the model is built with
    FakeTensorMode suspended, so every tensor its constructor makes is a plain meta tensor: a constructor that
    mixes a ``torch.tensor`` of config values with a computed one (Phi-3's longrope inverse frequencies, built
    from its short/long factors) would otherwise multiply a real meta tensor by a fake one and fail."""
    import transformers
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    fam = _family(cfg.model_type)
    if fam == "bert":
        cls = transformers.AutoModelForMaskedLM
    elif fam == "vit":
        cls = transformers.AutoModelForImageClassification
    elif fam == "seq2seq":
        cls = transformers.AutoModelForSeq2SeqLM
    elif fam == "clip":
        cls = transformers.AutoModel  # CLIPModel
    elif fam in VISION_LANGUAGE:
        cls = transformers.AutoModelForImageTextToText
    else:
        cls = transformers.AutoModelForCausalLM
    if cfg.model_type in NO_ATTENTION:
        attention = "eager"  # no attention module: transformers refuses any other implementation
    on_meta = torch.get_default_device().type == "meta"
    with unset_fake_temporarily() if on_meta else contextlib.nullcontext():
        model = cls.from_config(cfg, dtype=dtype, attn_implementation=attention)
    if fam == "llama4":
        model.language_model.register_forward_hook(_llama4_image_outputs)
    return model


def _llama4_image_outputs(module: Any, args: Any, output: Any) -> None:
    """transformers 5.24's ``Llama4ForConditionalGeneration.forward`` ends with ``image_outputs=outputs.
    image_outputs``, read off the language model's output, which has no such field: every call raises
    AttributeError (with ``return_dict=False`` too). The field set to None lets the step run as the code means it
    to (the image features not kept by the output); nothing else changes."""
    if not hasattr(output, "image_outputs"):
        object.__setattr__(output, "image_outputs", None)


def input_factory(
    cfg: Any,
    micro_batch_size: int,
    seq_len: int,
    float_dtype: torch.dtype,
    images: int = 0,
    image: Any = None,
) -> Callable[[], dict]:
    """A function making one training batch for ``cfg`` (call inside the trace). A multimodal batch holds
    ``images`` images per sample: CLIP pairs each with a text of ``seq_len`` tokens (``return_loss``); LLaVA puts
    each image's placeholder tokens before the ``seq_len`` text tokens."""
    fam = _family(cfg.model_type)
    b, s = micro_batch_size, seq_len
    if fam in (
        "qwen2_vl",
        "qwen2_5_vl",
        "llava_next",
    ):  # per-image sizes as Python values (trace/vlm_inputs.py)
        from . import vlm_inputs

        maker = vlm_inputs.qwen2_vl_batch if fam != "llava_next" else vlm_inputs.llava_next_batch
        return maker(cfg, b, s, float_dtype, images, image)
    vocab: Any = getattr(cfg, "vocab_size", None)  # cfg is a transformers config (Any)
    if fam in VISION_LANGUAGE:
        vc = cfg.vision_config
        img = vc.image_size
        vocab = cfg.text_config.vocab_size

    def make() -> dict[str, Any]:  # tensors, and CLIP's return_loss flag
        if fam == "clip":
            return {
                "input_ids": torch.randint(0, vocab, (b, s)),
                "pixel_values": torch.randn(b, vc.num_channels, img, img, dtype=float_dtype),
                "return_loss": True,
            }
        if fam == "llama4":
            return _llama4_batch(cfg, b, s, images, float_dtype)
        if fam in ("llava", "gemma3"):
            if (
                fam == "gemma3"
            ):  # pooled to mm_tokens_per_image; token_type_ids as Gemma 3's processor returns them
                per = cfg.mm_tokens_per_image
            else:
                per = (img // vc.patch_size) ** 2 + (cfg.vision_feature_select_strategy == "full")
            tok = cfg.image_token_id
            text = torch.randint(0, vocab - 1, (b, s))
            text = text + (text >= tok).long()  # never the image token
            ids = torch.cat([torch.full((b, images * per), tok, dtype=torch.long), text], dim=1)
            batch = {"input_ids": ids, "labels": ids}
            if fam == "gemma3":
                batch["token_type_ids"] = (ids == tok).long()
            if images:
                batch["pixel_values"] = torch.randn(b * images, vc.num_channels, img, img, dtype=float_dtype)
            return batch
        if fam == "vit":
            size = cfg.image_size
            return {
                "pixel_values": torch.randn(b, cfg.num_channels, size, size, dtype=float_dtype),
                "labels": torch.randint(0, cfg.num_labels, (b,)),
            }
        ids = torch.randint(0, vocab, (b, s))
        if fam == "seq2seq":
            return {"input_ids": ids, "labels": torch.randint(0, vocab, (b, s))}
        return {"input_ids": ids, "labels": ids}

    return make


@contextlib.contextmanager
def real_mode_shims(enabled: bool, notes: list[str]) -> Any:
    """Make transformers take the branches it takes on real tensors where it special-cases fake tensors.

    ``masking_utils.find_packed_sequence_indices`` treats fake tensors as "tracing" and then always returns a
    packed-sequence mask, which materialises a (b, 1, s, s) mask whenever no cache is used (e.g. with gradient
    checkpointing). On real, unpacked inputs (our batches: position_ids = arange) it returns None.
    """
    if not enabled:
        yield
        return
    try:
        from transformers import masking_utils
    except ImportError:  # pragma: no cover
        yield
        return
    orig = getattr(masking_utils, "find_packed_sequence_indices", None)
    if orig is None:
        yield
        return

    def _unpacked(position_ids: torch.Tensor) -> None:
        return None

    masking_utils.find_packed_sequence_indices = _unpacked
    notes.append(
        "shim: masking_utils.find_packed_sequence_indices -> None (inputs are unpacked, as on real tensors)"
    )
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = orig


def _llama4_batch(cfg: Any, b: int, s: int, images: int, float_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A Llama 4 batch as its processor makes it for one-tile images (336px or less): per image
    ``<|image_start|>``, (image/patch)^2 x ratio^2 ``<|patch|>`` tokens, ``<|image|>``, ``<|image_end|>``
    (families/llama4_vlm.py), before the ``s`` text tokens; one tile of pixels per image."""
    vc = cfg.vision_config
    img, vocab, tok = vc.image_size, cfg.text_config.vocab_size, cfg.image_token_index
    rows = round((img // vc.patch_size) ** 2 * vc.pixel_shuffle_ratio**2)
    frame = 1 if tok != 1 else 2  # the frame tokens' ids matter not (any text token), only their count
    one = [frame] + [tok] * rows + [frame, frame]
    text = torch.randint(0, vocab - 1, (b, s))
    text = text + (text >= tok).long()  # never the image token
    ids = torch.cat([torch.tensor(one * images, dtype=torch.long).expand(b, -1), text], dim=1)
    batch = {"input_ids": ids, "labels": ids}
    if images:
        batch["pixel_values"] = torch.randn(b * images, vc.num_channels, img, img, dtype=float_dtype)
    return batch


@contextlib.contextmanager
def _no_data_checks(enabled: bool, notes: list[str]) -> Any:
    """Skip transformers' ``torch_compilable_check`` (LLaVA's image-token count against the image features):
    on fake tensors the count has no value to compare; the batches are built with exactly the right count."""
    import os

    if not enabled:
        yield
        return
    key = "TRANSFORMERS_DISABLE_TORCH_CHECK"
    old = os.environ.get(key)
    os.environ[key] = "1"
    notes.append(f"{key}=1: the image-token count check needs real values (batches carry the right count)")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def loss_module(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose forward ends the 'forward' phase (LM head / classifier)."""
    hf: Any = model  # a transformers model: torch's stubs type its attributes as Tensor | Module
    try:
        m = hf.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        m = None
    if m is None:
        m = getattr(model, "classifier", None)
    return m


def trace_hf(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    precision: str = "bf16",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    attention: str = "sdpa",
    gradient_checkpointing: bool = False,
    lora: dict[str, Any] | None = None,
    qlora: bool = False,
    layer_checkpointing: tuple[str, int] | None = None,
    vision: dict[str, Any] | None = None,
    float8: str | None = None,
    steps: int = 2,
    fake: bool = True,
    lengths: tuple[int, ...] = (),
    compile_loss: bool = False,
    **kwargs: Any,
) -> TraceResult:
    """Trace HF-style training of a transformers model built from ``config`` (a dict with ``model_type``).

    ``lora``: {"r", "lora_alpha", "target_modules", "adapter_dtype": "fp32"|"bf16", "lora_dropout", "target_scope"};
    fp32 is peft's default (``autocast_adapter_dtype=True`` upcasts 16-bit adapters); ``target_scope`` "language"
    keeps a multimodal model's tower and projector free of adapters (else peft matches names everywhere). ``layer_checkpointing``: (policy, every)
    for :func:`~memsim_widget.trace.checkpointing.apply_layer_checkpointing` (torchtitan's per-op selective
    or every-N full checkpointing; the KV cache is off, as under HF's own checkpointing). ``vision`` (multimodal
    models): {"images": per sample, "freeze": the vision tower's parameters frozen}. ``float8``: torchao's
    float8 training recipe ("tensorwise" or "rowwise", trace/float8.py) on every Linear but the head. Extra keyword
    arguments go to :func:`trace_training` (``output_lifetime``, ``top_n``, ...). ``compile_loss``: the loop
    computes the loss on the logits, compiled apart (torchtitan; ``compiled.compiled_loop_loss``). ``lengths``: one
    sequence length per step (batches padded to their longest sample vary per step); sets ``steps``."""
    notes: list[str] = []
    if qlora:
        raise NotImplementedError(
            "qlora: bitsandbytes 4-bit layers need CUDA kernels and do not run on CPU fake tensors; not traced"
        )
    wdtype, _amp = precision_dtypes(precision)
    image = None  # the image the batch holds (its patches or crops), as the engine reads it from the config
    if config.get("model_type") in ("qwen2_vl", "qwen2_5_vl", "llava_next"):
        # the family's own builder from the registry (these types always have one; the dispatcher would pull in
        # calibrate, whose fits run this tracer)
        from memsim_widget.architecture.types import FAMILIES

        image = FAMILIES[config["model_type"]](config).extra["vision"]
        config = {k: v for k, v in config.items() if k not in MEMSIM_MODEL_KEYS}
    cfg = build_hf_config(config, attention)
    if layer_checkpointing:
        cfg.use_cache = False
    input_dtype = wdtype

    def model_factory() -> torch.nn.Module:
        # Under fake mode, build on the meta device (Module.to cannot swap fake parameters, which peft needs);
        # trace_training then swaps in fake cpu tensors.
        with torch.device("meta") if fake else contextlib.nullcontext():
            model = build_hf_model(cfg, wdtype, attention)
            frozen = VISION_MODULES[cfg.model_type] if vision and vision.get("freeze") else ()
            if frozen:
                for name, p in model.named_parameters():
                    if any(part in name for part in frozen):
                        p.requires_grad_(False)
                notes.append(f"vision tower frozen: parameters under {', '.join(frozen)}")
            if float8:
                from .float8 import apply_float8

                model = apply_float8(model, float8, notes)
            if lora:
                # peft matches the target names across the whole model unless the scope keeps the vision side out
                language = vision and lora.get("target_scope") == "language"
                exclude = (
                    VISION_MODULES[cfg.model_type] + PROJECTOR_MODULES[cfg.model_type] if language else ()
                )
                model = apply_lora(model, lora, notes, exclude=exclude)
            if layer_checkpointing:
                from .checkpointing import apply_layer_checkpointing

                n = apply_layer_checkpointing(model, *layer_checkpointing)
                notes.append(f"layer checkpointing {layer_checkpointing}: {n} blocks wrapped")
            if compile_loss:  # the loop computes the loss on the logits (torchtitan train.py)
                model.register_forward_pre_hook(drop_labels, with_kwargs=True)
        return model

    fam = _family(cfg.model_type)
    if fam == "seq2seq" and getattr(cfg, "decoder_start_token_id", None) is None:
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
        notes.append(f"decoder_start_token_id unset; using {cfg.decoder_start_token_id}")
    if gradient_checkpointing and lora:
        notes.append(
            "gradient checkpointing with LoRA: HF enable_input_require_grads makes embeddings require grad"
        )
    if fam == "decoder" and getattr(cfg, "use_cache", False) and not gradient_checkpointing:
        notes.append(
            "config.use_cache=True: HF builds a DynamicCache in training; it lives with the model output"
        )
    with (
        real_mode_shims(fake, notes),
        _no_data_checks(fake and fam in VISION_LANGUAGE and fam != "clip", notes),
    ):
        images = (vision or {}).get("images", 0)
        makers = [
            input_factory(cfg, micro_batch_size, n, input_dtype, images, image) for n in lengths or (seq_len,)
        ]
        calls = iter(range(1 << 62))
        kwargs |= {"loss_fn": _loop_loss(notes)} if compile_loss else {}
        return trace_training(
            model_factory,
            (lambda: makers[next(calls) % len(makers)]()) if lengths else makers[0],
            precision=precision,
            optimizer=optimizer,
            optimizer_impl=optimizer_impl,
            steps=len(lengths) or steps,
            gradient_checkpointing=gradient_checkpointing,
            fake=fake,
            loss_module=loss_module,
            notes=notes,
            cast_model=False,
            **kwargs,
        )


def _loop_loss(notes: list[str]) -> Any:
    """The loss the loop computes on the logits, compiled apart (torchtitan's ``loss_fn``)."""
    from .compiled import compiled_loop_loss

    notes.append("the loss computed on the logits by the loop, compiled apart (torchtitan's loss_fn)")
    return compiled_loop_loss()


def apply_lora(
    model: torch.nn.Module, lora: dict[str, Any], notes: list[str], exclude: tuple[str, ...] = ()
) -> torch.nn.Module:
    """Wrap ``model`` with peft LoRA adapters as described by ``lora`` (none in modules under ``exclude``)."""
    from peft import LoraConfig, get_peft_model

    adapter_dtype = lora.get("adapter_dtype", "fp32")
    excluded: dict[str, Any] = {"exclude_modules": f".*({'|'.join(exclude)}).*"} if exclude else {}
    lcfg = LoraConfig(
        r=lora.get("r", 8),
        lora_alpha=lora.get("lora_alpha", 16),
        target_modules=lora.get("target_modules", ["q_proj", "v_proj"]),
        lora_dropout=lora.get("lora_dropout", 0.0),
        task_type=lora.get("task_type"),
        **excluded,
    )
    model = get_peft_model(model, lcfg, autocast_adapter_dtype=(adapter_dtype == "fp32"))
    target = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[adapter_dtype]
    dts: set[str] = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                if p.dtype != target:
                    p.data = p.data.to(target)
                dts.add(str(p.dtype).removeprefix("torch."))
    notes.append(f"lora adapters dtype: {sorted(dts)}")
    return model
