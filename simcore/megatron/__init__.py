"""The ``megatron`` convention: GPT and Llama transformers as Megatron-LM trains them."""

from simcore.megatron.step import estimate_megatron, layer_time, uses_flash_attention

__all__ = ["estimate_megatron", "layer_time", "uses_flash_attention"]
