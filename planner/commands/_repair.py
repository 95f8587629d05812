"""``planner repair JOURNAL``: keep every valid entry of a damaged journal file."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.commands._base import BaseCommand
from planner.errors import PlannerUsageError


class RepairCommand(BaseCommand):
    name = "repair"
    help = ("Drop the lines of a damaged journal file that are not Optuna entries, keeping every"
            " valid one (a .bak copy first).")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("journal", type=Path, help="the journal file (a --storage path)")

    def run(self, args: argparse.Namespace) -> int:
        from planner.journal_repair import repair_journal

        path: Path = args.journal
        if not path.is_file():
            raise PlannerUsageError(f"{path}: no such journal file; give a --storage path")
        done = repair_journal(path)
        if not done.dropped:
            print(f"{path}: {done.kept:,} entries, every line valid; nothing to repair")
            return 0
        lines = ", ".join(map(str, done.dropped[:10])) + (" ..." if len(done.dropped) > 10 else "")
        print(f"{path}: kept {done.kept:,} entries, dropped {len(done.dropped)} line(s) that"
              f" were not journal entries (line {lines}); the file as it was is {done.backup}")
        return 0
