"""Runs each test module's interpreted subprocess (tests/interpreter.py) beside the rest of the suite."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.interpreter import InterpretedRun


def pytest_configure(config: pytest.Config) -> None:
    """Runs made by the tests (the interpreted subprocesses' too) append to a history of their own, not to
    the checkout's results/history.sqlite."""
    os.environ["GDNBENCH_HISTORY"] = os.path.join(tempfile.mkdtemp(prefix="gdnbench-test-history-"), "h.sqlite")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that wait for an interpreted subprocess run last (the sort is stable: the order is otherwise
    kept), so the other tests run while the subprocesses work."""
    items.sort(key=lambda item: "interpreted" in item.fixturenames)


@pytest.fixture(scope="session", autouse=True)
def interpreted_runs(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, InterpretedRun | None]]:
    """Before the first test, starts the subprocess of every module with a collected test that reads it,
    keyed by module name (None where the module has nothing to run, e.g. a library not installed)."""
    modules = sorted({item.module for item in request.session.items if "interpreted" in item.fixturenames},
                     key=lambda m: m.__name__)
    runs = {m.__name__: m.start_interpreted(tmp_path_factory.mktemp(m.__name__.rsplit(".", 1)[-1]))
            for m in modules}
    yield runs
    for run in runs.values():
        if run is not None:
            run.stop()
