"""The subcommands of ``planner``, in the order ``--help`` lists them.

Each is named and described here and imported only when it is chosen, so ``planner --help``
and the light commands (``estimate``, ``catalog``, ...) start without Optuna, pandas or plotly
(issue 19: every command paid about 1 s of imports). A command class says the same name and
help as its entry here (tests/test_cli_startup.py checks it).
"""

from __future__ import annotations

import argparse
import functools
import importlib

from planner.commands._base import BaseCommand


class LazyCommand(BaseCommand):
    """A subcommand whose module (``planner.commands.<module>``) is imported on first use."""

    def __init__(self, name: str, help: str, module: str, class_name: str) -> None:
        self.name, self.help = name, help
        self._module, self._class_name = module, class_name

    @functools.cached_property
    def command(self) -> BaseCommand:
        """The command itself, its module imported now."""
        module = importlib.import_module(f"planner.commands.{self._module}")
        command: BaseCommand = getattr(module, self._class_name)()
        return command

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.command.add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        return self.command.run(args)


COMMANDS: list[BaseCommand] = [
    LazyCommand("run", "Run a study (YAML) into the storage, then print its best plans.",
                "_run", "RunCommand"),
    LazyCommand("worker", "Work on a study shared by processes on many machines through a"
                " database (creates it if absent).", "_worker", "WorkerCommand"),
    LazyCommand("mixed", "Search a cluster that mixes device types: the best plan, and the best"
                " on each device group alone.", "_mixed", "MixedCommand"),
    LazyCommand("best", "The best feasible plans of a stored study (the Pareto front with two"
                " objectives).", "_results", "BestCommand"),
    LazyCommand("trials", "Every trial of a stored study: strategy, estimate parts, feasibility;"
                " CSV / Parquet.", "_results", "TrialsCommand"),
    LazyCommand("studies", "The studies in the storage: model, system, sampler, trials, plans (and"
                " which are kept as trials), whether the run finished, best step time.", "_results",
                "StudiesCommand"),
    LazyCommand("repair", "Drop the lines of a damaged journal file that are not Optuna entries,"
                " keeping every valid one (a .bak copy first).", "_repair", "RepairCommand"),
    LazyCommand("pareto", "A page of step time against peak memory: every trial, the Pareto"
                " front, the limit.", "_pareto", "ParetoCommand"),
    LazyCommand("sweep", "A figure of throughput and step time against one knob or the device"
                " count, the rest fixed (--where) or the best plan per point; no study is"
                " stored.", "_sweep", "SweepCommand"),
    LazyCommand("compare", "One model on several systems under several HBM limits: best plan per"
                " cell, CSV + HTML.", "_compare", "CompareCommand"),
    LazyCommand("export", "The best plans of a study as plan files, Megatron-LM arguments, a"
                " DeepSpeed config, torchtitan configs, ASTRA-sim + STAGE inputs or Chakra"
                " traces.", "_export", "ExportCommand"),
    LazyCommand("show", "A timeline of one training step of a stored plan: forward/backward per"
                " micro-batch and stage, exposed communication, bubble (plotly HTML or PNG).",
                "_show", "ShowCommand"),
    LazyCommand("report", "One HTML page of a study: inputs, best plans, Pareto front, step-time"
                " breakdown and the best plan's timeline.", "_report", "ReportCommand"),
    LazyCommand("catalog", "List the catalog's models, systems or devices (studies/catalog/ and"
                " your own folder).", "_catalog", "CatalogCommand"),
    LazyCommand("estimate", "Step time and peak memory of one plan, with every part.",
                "_estimate", "EstimateCommand"),
    LazyCommand("validate", "Estimate measured runs (a CSV) and report the error and the"
                " plan-choice regret.", "_validate", "ValidateCommand"),
    LazyCommand("calibrate", "Fit a device's calibration constants to measured runs (a CSV, as"
                " `validate` takes) and write the calibrated device into your catalog.",
                "_calibrate", "CalibrateCommand"),
    LazyCommand("astra-estimate", "Report what STAGE (recomp) + ASTRA-sim (analytical) would for"
                " a STAGE command line, from ASTRA-sim's own input files.",
                "_astra_estimate", "AstraEstimateCommand"),
    LazyCommand("replay", "Simulate Chakra execution traces (PREFIX.<npu>.et) as ASTRA-sim's"
                " analytical backend does, from its own input files.", "_replay",
                "ReplayCommand"),
    LazyCommand("convert-text", "Convert an ASTRA-sim 1.0 text workload to Chakra traces, one"
                " per NPU.", "_convert_text", "ConvertTextCommand"),
    LazyCommand("import-astra", "Import an ASTRA-sim system (system JSON + network YAML) into"
                " your catalog, as a system --system can name.", "_import_astra",
                "ImportAstraCommand"),
    LazyCommand("import-metis", "Import Metis's hostfile, cluster file and profiles into your"
                " catalog: a mixed system and its layer profiles, for planner mixed.",
                "_import_metis", "ImportMetisCommand"),
    LazyCommand("collective", "Time one collective as ASTRA-sim's analytical backend would, from"
                " its own input files.", "_collective", "CollectiveCommand"),
]

__all__ = ["COMMANDS", "BaseCommand", "LazyCommand"]
