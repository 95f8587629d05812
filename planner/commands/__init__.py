"""The subcommands of ``planner``, in the order ``--help`` lists them."""

from __future__ import annotations

from planner.commands._astra_estimate import AstraEstimateCommand
from planner.commands._base import BaseCommand
from planner.commands._catalog import CatalogCommand
from planner.commands._collective import CollectiveCommand
from planner.commands._compare import CompareCommand
from planner.commands._estimate import EstimateCommand
from planner.commands._export import ExportCommand
from planner.commands._pareto import ParetoCommand
from planner.commands._results import BestCommand, StudiesCommand, TrialsCommand
from planner.commands._run import RunCommand

COMMANDS: list[BaseCommand] = [
    RunCommand(), BestCommand(), TrialsCommand(), StudiesCommand(), ParetoCommand(),
    CompareCommand(), ExportCommand(), CatalogCommand(),
    EstimateCommand(), AstraEstimateCommand(), CollectiveCommand(),
]

__all__ = ["BaseCommand", "COMMANDS"]
