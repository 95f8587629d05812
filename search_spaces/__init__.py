"""What a study may search: the allowed values of every knob, the rules a plan must obey, every
valid strategy (exhaustive search) and a valid strategy sampled from an Optuna trial.

Knows simcore's specs and Optuna's trial interface; nothing of files or plots.
"""

from search_spaces.encoding import LayoutEncoding, strategy_label
from search_spaces.space import Layout, PipelineChoice, StrategySpace, divisors, powers_of_two

__all__ = [
    "Layout",
    "LayoutEncoding",
    "PipelineChoice",
    "StrategySpace",
    "divisors",
    "powers_of_two",
    "strategy_label",
]
