"""The ``megatron`` convention: a GPT or Llama transformer as Megatron-LM trains it."""

from simcore.megatron.step import estimate_megatron, layer_time

__all__ = ["estimate_megatron", "layer_time"]
