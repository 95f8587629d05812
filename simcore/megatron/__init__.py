"""The ``megatron`` convention: GPT and Llama transformers as Megatron-LM trains them."""

from simcore.megatron.stack import uses_flash_attention
from simcore.megatron.step import estimate_megatron, layer_time

__all__ = ["estimate_megatron", "layer_time", "uses_flash_attention"]
