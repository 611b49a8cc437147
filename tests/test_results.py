"""The run directory's rows: typed in memory, plain text in results.csv."""

import csv

import pytest

from gdnbench.results import CASE_COLUMNS, COLUMNS, ROW_COLUMNS, Row, RunDir, Status, load_run
from gdnbench.suite import Case


def test_a_row_is_written_with_plain_status_names_and_its_case_after_the_row_columns(tmp_path):
    case = Case(op="prefill", B=1, T=8, H=1, D=8)
    rows = [Row(suite="s", case_id=case.id, backend=f"b{i}", status=status, case=case.fields())
            for i, status in enumerate(Status)]
    RunDir(tmp_path).add_case(rows, [])
    with open(tmp_path / "results.csv", newline="") as f:
        header, *cells = list(csv.reader(f))
    assert header == COLUMNS == ROW_COLUMNS + CASE_COLUMNS
    statuses = ["PASS", "FAIL", "NAN", "ERROR", "OOM", "TIMEOUT", "CRASH", "SKIP"]
    assert [r[header.index("status")] for r in cells] == statuses
    assert cells[0][header.index("T")] == "8" and cells[0][header.index("case_id")] == case.id
    df, _ = load_run(tmp_path)
    assert df["status"].tolist() == [s.value for s in Status]


def test_a_status_formats_as_its_name():
    assert str(Status.PASS) == f"{Status.PASS}" == "PASS" and Status("NAN") is Status.NAN


def test_a_row_refuses_a_column_it_does_not_have():
    row = Row(suite="s", case_id="c", backend="b")
    row.update(status=Status.PASS, median_us=1.5)
    assert row.as_dict()["median_us"] == 1.5
    with pytest.raises(KeyError, match="no column 'median'"):
        row.update(median=1.5)
