"""gdnbench schema: the JSON Schemas of a results.csv row and of run.json."""

from __future__ import annotations

import json

from gdnbench.cli.common import console
from gdnbench.results import json_schemas


def schema() -> None:
    """Print the JSON Schemas of a results.csv row (its case's fields included) and of run.json, and the
    schema version that run.json's `schema` holds. The columns' meanings: docs/results-schema.md."""
    console.print_json(json.dumps(json_schemas()))
