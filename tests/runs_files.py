"""A measured-runs CSV of tests/data/validation read another way: the same rows with some
columns set otherwise, written where a test can validate it."""

from __future__ import annotations

import csv
from pathlib import Path


def reread(source: Path, dest: Path, **columns: str) -> list[dict[str, str]]:
    """Writes ``source``'s rows to ``dest`` with each of ``columns`` set as given (its model
    references made absolute, so that they still find ``source``'s models.yaml) and returns the
    rows as ``source`` had them."""
    with source.open(newline="") as f:
        reader = csv.DictReader(f)
        rows, fields = list(reader), list(reader.fieldnames or ())
    as_read = [dict(row) for row in rows]
    for row in rows:
        row.update(columns)
        if row["model"].startswith("models.yaml#"):
            row["model"] = str(source.parent / row["model"])
    with dest.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return as_read
