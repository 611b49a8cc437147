"""Messages that read the same at any terminal width: `gdnbench list` (why a backend cannot run here, its
text wrapped, never cut) and errors (one line, the real source named, a close spelling suggested)."""

import re

import pytest
import torch
from typer.testing import CliRunner

from gdnbench.backends import registry
from gdnbench.cli import app


def test_a_cuda_backend_cannot_run_on_a_cpu():
    cpu = torch.device("cpu")
    assert registry()["fla.chunk"].unusable_on(cpu) == "fla.chunk: runs on cuda, not cpu"
    assert registry()["torch.recurrent"].unusable_on(cpu) is None


@pytest.mark.parametrize("columns", [80, 200])
def test_list_keeps_every_word_at_any_width(columns):
    res = CliRunner().invoke(app, ["list"], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    # table borders and line breaks aside, the words of every description are all there, whole
    words = set(re.findall(r"[\w.+-]+", res.output))
    for name, b in registry().items():
        assert name in words
        missing = [w for w in re.findall(r"[\w.+-]+", b.description) if w not in words]
        assert not missing, f"{name}: {missing} cut from its description"
    if not torch.cuda.is_available():
        text = " ".join(re.sub(r"[│┃]", " ", res.output).split())  # a wrapped cell's lines, rejoined
        assert "why not here: runs on cuda, not cpu" in text
    # every reason whole, a word wider than its column folded onto the next line, never cut
    assert "…" not in res.output
    cells = "".join(line.split("│")[3] for line in res.output.splitlines() if line.count("│") == 4)
    here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for name, b in registry().items():
        reason = b.unavailable() or b.unusable_on(here)
        if reason:
            assert "".join(reason.removeprefix(f"{name}: ").split()) in "".join(cells.split()), name


@pytest.mark.parametrize("columns", [80, 200])
def test_an_error_names_a_long_path_whole(tmp_path, columns):
    deep = tmp_path / ("a-long-checkout-path-" * 8) / "suites"
    deep.mkdir(parents=True)
    suite = deep / "mine.yaml"
    suite.write_text("name: mine\nbackends: [torch.recurrent]\ncases:\n  - {B: 1, T: 8, H: 1, Hv: 1, D: 16}\n")
    res = CliRunner().invoke(app, ["run", str(suite), "--device", "cpu", "--out", str(tmp_path / "out")],
                             env={"COLUMNS": str(columns)})
    assert res.exit_code == 2
    assert f"{suite}: cases[0]: field 'Hv': unknown field; did you mean 'HV'?" in res.output
