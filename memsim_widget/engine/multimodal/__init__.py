"""The vision side of multimodal models, one module per kind: ``tower`` (CLIP, LLaVA, Gemma 3, and the dispatch to
the others), ``qwen_vl`` (Qwen2-VL, Qwen2.5-VL), ``llava_next`` (LLaVA-NeXT's crops) and ``llama4`` (Llama 4's
adapter and projector)."""
