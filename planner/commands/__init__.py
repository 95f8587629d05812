"""The subcommands of ``planner``, in the order ``--help`` lists them."""

from __future__ import annotations

from planner.commands._astra_estimate import AstraEstimateCommand
from planner.commands._base import BaseCommand
from planner.commands._calibrate import CalibrateCommand
from planner.commands._catalog import CatalogCommand
from planner.commands._collective import CollectiveCommand
from planner.commands._compare import CompareCommand
from planner.commands._convert_text import ConvertTextCommand
from planner.commands._estimate import EstimateCommand
from planner.commands._export import ExportCommand
from planner.commands._import_astra import ImportAstraCommand
from planner.commands._import_metis import ImportMetisCommand
from planner.commands._mixed import MixedCommand
from planner.commands._pareto import ParetoCommand
from planner.commands._replay import ReplayCommand
from planner.commands._report import ReportCommand
from planner.commands._results import BestCommand, StudiesCommand, TrialsCommand
from planner.commands._run import RunCommand
from planner.commands._show import ShowCommand
from planner.commands._sweep import SweepCommand
from planner.commands._validate import ValidateCommand
from planner.commands._worker import WorkerCommand

COMMANDS: list[BaseCommand] = [
    RunCommand(), WorkerCommand(), MixedCommand(),
    BestCommand(), TrialsCommand(), StudiesCommand(), ParetoCommand(),
    SweepCommand(), CompareCommand(), ExportCommand(), ShowCommand(), ReportCommand(),
    CatalogCommand(),
    EstimateCommand(), ValidateCommand(), CalibrateCommand(), AstraEstimateCommand(),
    ReplayCommand(), ConvertTextCommand(), ImportAstraCommand(), ImportMetisCommand(), CollectiveCommand(),
]

__all__ = ["BaseCommand", "COMMANDS"]
