"""Training batches for the vision-language models whose forward reads per-image sizes as Python values
(Qwen2-VL / Qwen2.5-VL, LLaVA-NeXT), made so that the real transformers modules run on fake tensors.

Qwen2-VL's vision tower turns ``image_grid_thw`` and ``cu_seqlens`` into Python lists (``.tolist()``: the patch
positions, the per-image attention splits, the split of the merged features), which a fake tensor cannot answer.
transformers 5.24 lets a caller pass each of those precomputed (``vision_utils``: ``image_position_ids``,
``image_cu_seqlens``, ``image_window_index``, ``image_cu_window_seqlens``; ``accepts_precomputed_kwargs``), and
the model skips its M-RoPE index computation when ``position_ids`` are given. The batch therefore carries:

- the index tensors the modules compute on (patch positions, window order, the (3, b, s) M-RoPE positions) as
  ordinary tensors of the right shape and dtype (fake in the trace: their values change no memory);
- the lengths the modules turn into Python lists (``image_grid_thw``, ``cu_seqlens``, ``cu_window_seqlens``) as
  small numpy arrays holding the real values, computed by transformers' own helpers on real CPU tensors
  (numpy answers ``prod``, slicing, subtraction and ``tolist`` as the tensor would).

LLaVA-NeXT reads each image's original size (``image_sizes``) as Python values to pick its tiling and unpad the
features: the batch passes it as a numpy array, which ``get_anyres_image_grid_shape`` and ``unpad_image`` accept.

Everything else -- the patch embedding, every block, the per-image SDPA calls, the merger, the scatter into the
text embeddings, the language model and the loss -- is the unchanged transformers code on fake tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def _qwen_lengths(cfg: Any, grid: tuple[int, int, int], n_img: int) -> dict[str, np.ndarray]:
    """The per-image lengths Qwen2(.5)-VL's tower reads as Python values, from transformers' helpers run on a
    real CPU grid tensor (outside fake mode)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers import vision_utils

    vc = cfg.vision_config
    with unset_fake_temporarily():
        thw = torch.tensor([list(grid)] * n_img, dtype=torch.long, device="cpu")
        out = {
            "image_grid_thw": thw.numpy().copy(),
            "image_cu_seqlens": vision_utils.get_vision_cu_seqlens(thw).numpy().copy(),
        }
        if cfg.model_type == "qwen2_5_vl":
            _, cu_win = vision_utils.get_vision_window_index(
                thw, vc.spatial_merge_size, vc.window_size, vc.patch_size
            )
            out["image_cu_window_seqlens"] = cu_win.numpy().copy()
    return out


def qwen2_vl_batch(
    cfg: Any, b: int, s: int, float_dtype: torch.dtype, images: int, vision: dict
) -> Callable[[], dict]:
    """A function making one Qwen2-VL / Qwen2.5-VL batch: ``images`` images of the engine's (t, h, w) patch grid
    (``vision``: the Architecture's vision dict) per sample, their (h w / m^2) image tokens before ``s`` text
    tokens, labels = input ids."""
    grid = vision["tower"].extra["grid"]
    vc = cfg.vision_config
    vocab = cfg.text_config.vocab_size
    m = vc.spatial_merge_size
    per_img = grid[0] * grid[1] * grid[2]
    tokens = per_img // (m * m)
    n_img = b * images
    lengths = _qwen_lengths(cfg, grid, n_img) if n_img else {}
    image_tok, video_tok = cfg.image_token_id, cfg.video_token_id
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2

    def make() -> dict[str, Any]:
        text = torch.randint(0, vocab - 2, (b, s))
        for tok in sorted((image_tok, video_tok)):
            text = text + (text >= tok).long()  # never an image or video token
        ids = torch.cat([torch.full((b, images * tokens), image_tok, dtype=torch.long), text], dim=1)
        S = ids.shape[1]
        batch: dict[str, Any] = {
            "input_ids": ids,
            "labels": ids,
            "position_ids": torch.arange(S).view(1, 1, S).expand(3, b, S).clone(),  # M-RoPE: (3, b, s)
        }
        if n_img:
            batch["pixel_values"] = torch.randn(n_img * per_img, width, dtype=float_dtype)
            batch["image_position_ids"] = torch.zeros(n_img * per_img, 2, dtype=torch.long)
            if cfg.model_type == "qwen2_5_vl":
                batch["image_window_index"] = torch.arange(n_img * tokens)
            batch.update(lengths)
        return batch

    return make


def llava_next_batch(
    cfg: Any, b: int, s: int, float_dtype: torch.dtype, images: int, vision: dict
) -> Callable[[], dict]:
    """A function making one LLaVA-NeXT batch as its processor returns it: ``images`` images per sample, each
    (1 + tiles) crops of the tower's input size (``pixel_values`` [images, crops, C, s, s]) with its original
    ``image_sizes`` (a numpy array: the model turns each row into Python values), and the image's tokens
    (base crop, unpadded tiles, newlines) before ``s`` text tokens."""
    vc = cfg.vision_config
    vocab = cfg.text_config.vocab_size
    tok = cfg.image_token_id
    per, crops = vision["tokens_per_image"], vision["crops_per_image"]
    n_img = b * images
    sizes = np.array([list(vision["image_size"])] * n_img, dtype=np.int64)

    def make() -> dict[str, Any]:
        text = torch.randint(0, vocab - 1, (b, s))
        text = text + (text >= tok).long()  # never the image token
        ids = torch.cat([torch.full((b, images * per), tok, dtype=torch.long), text], dim=1)
        batch: dict[str, Any] = {"input_ids": ids, "labels": ids}
        if n_img:
            side = vc.image_size
            batch["pixel_values"] = torch.randn(n_img, crops, vc.num_channels, side, side, dtype=float_dtype)
            batch["image_sizes"] = sizes
        return batch

    return make
