"""The README's main command: controllers head to head, a table and a report with plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.demo import HEURISTICS
from models import catalogue
from models.policy import policy_available
from tuner.cli import main


def test_demo_compares_controllers_and_writes_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["demo", "--seconds", "1", "--controllers", "unpartitioned,eq", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    for name in ("unpartitioned", "eq"):
        assert name in out
    assert "violations" in out and "scenario 'demo'" in out
    assert f"report: {tmp_path}/report.md" in out
    assert (tmp_path / "timeline_demo.png").is_file() and (tmp_path / "tradeoff.png").is_file()


def test_demo_default_runs_the_heuristics_and_the_bundled_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--seconds", "0.5", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in HEURISTICS.split(","):
        assert f"running {name} ..." in out
    assert ("running policy[decide_s=1] ..." in out) == policy_available()
    assert "failed" not in out


@pytest.mark.parametrize(
    ("controllers", "message"),
    [
        ("nope", "unknown controller 'nope'"),
        (",", "--controllers ',' names no controller"),  # was an IndexError
        ("", "--controllers '' names no controller"),  # ran the default set
        ("eq,eq", "two controllers are labelled 'eq'"),  # two runs counted as a CI
    ],
)
def test_demo_rejects_controllers_it_cannot_run_as_given(controllers, message, capsys) -> None:
    assert main(["demo", "--seconds", "1", "--controllers", controllers]) == 2  # a usage error
    err = capsys.readouterr().err
    assert err.startswith("rdtune demo: ") and message in err and err.count("\n") == 1


def test_a_failed_controller_fails_the_demo_and_the_report_says_how_to_run_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a demo in which a controller failed exited 0, and the report's command left
    out --controllers and --interval."""
    crashy = "import:tests.tuner.controllers:Crashy"
    args = ["demo", "--seconds", "1", "--interval", "0.2", "--controllers", f"eq,{crashy}",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 1
    assert f"rdtune demo: 1 of 2 controllers failed: {crashy}" in capsys.readouterr().err
    report = (tmp_path / "report.md").read_text()
    assert (
        f"rdtune demo --scenario demo --seconds 1 --interval 0.2 --seed 0 --controllers eq,{crashy}"
        f" --out {tmp_path}"
    ) in report


def test_the_demo_replaces_its_own_report_and_another_only_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a demo into an evaluation's --out replaced its report without a word."""
    import json

    demo = ["demo", "--seconds", "1", "--controllers", "eq", "--out", str(tmp_path)]
    assert main(demo) == 0
    assert main(demo) == 0  # its own report: replaced, as `make demo` does each time
    data = json.loads((tmp_path / "results.json").read_text())
    for run in data["runs"]:
        run["suite"] = "smoke"  # now an evaluation's report
    (tmp_path / "results.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(demo) == 2
    err = capsys.readouterr().err
    assert "holds a report already" in err and "--force" in err
    assert json.loads((tmp_path / "results.json").read_text())["runs"][0]["suite"] == "smoke"
    assert main([*demo, "--force"]) == 0


def test_registry_lists_the_basics() -> None:
    assert {"unpartitioned", "eq"} <= set(catalogue.names())


def test_demo_shows_specs_with_options_verbatim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["demo", "--seconds", "0.5", "--controllers", "static[ways=3]", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "running static[ways=3] ..." in out and "│ static[ways=3]" in out


@pytest.mark.parametrize(("seconds", "interval"), [("2", "100"), ("0.5", "1")])
def test_demo_refuses_a_run_shorter_than_one_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seconds: str, interval: str
) -> None:
    argv = ["demo", "--seconds", seconds, "--interval", interval, "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"rdtune demo: --seconds {seconds} is shorter than one --interval ({interval} s)\n"
    )
    assert "running" not in captured.out and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "where", ["file/report", "/proc/rdtune-demo"], ids=["under-a-file", "proc"]
)
def test_demo_refuses_an_out_it_cannot_write_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    (tmp_path / "file").write_text("in the way")
    out = tmp_path / where  # an absolute where replaces tmp_path
    assert main(["demo", "--controllers", "eq", "--seconds", "1", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"rdtune demo: --out {out}: ") and captured.err.count("\n") == 1
    assert "running" not in captured.out


@pytest.mark.parametrize("command", ["demo", "eval"])
@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        ("missing/nope.yaml", None, "{path}: no such file"),
        ("nope.yml", None, "{path}: no such file"),
        ("list.yaml", "- machine: gold6130\n", "{path}: not a scenario (a mapping with"),
        ("config.yaml", "name: x\nalgorithm: PPO\n", "{path}: not a scenario (a mapping with"),
        ("empty.yaml", "", "{path}: not a scenario (a mapping with 'machine' and 'workloads')"),
    ],
    ids=["missing-dir", "missing-file", "list", "training-config", "empty"],
)
def test_a_scenario_path_that_is_not_a_scenario_file_says_what_it_is(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    name: str,
    text: str | None,
    error: str,
) -> None:
    """``rdtune demo --scenario`` and ``rdtune eval --scenarios`` resolve it in the one
    place (agent.sim.scenario.get_scenario), and say the same. A value with a '/' or a
    YAML suffix is a path (given relative here), never a scenario's name."""
    monkeypatch.chdir(tmp_path)
    if text is not None:
        Path(name).write_text(text)
    out = tmp_path / "out"
    if command == "demo":
        argv = ["demo", "--scenario", name, "--seconds", "0.5", "--out", str(out)]
    else:
        argv = ["eval", "--suite", "smoke", "--scenarios", name, "--seconds", "0.5",
                "--ray-address", "none", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"rdtune {command}: " + error.format(path=name)), captured.err
    assert captured.err.count("\n") == 1 and "unknown scenario" not in captured.err
    assert "running" not in captured.out and not out.exists()


@pytest.mark.parametrize("existed", [False, True])
def test_an_interrupted_demo_leaves_no_empty_out_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existed: bool
) -> None:
    """A demo keeps nothing of runs cut short: the --out it made goes with them, and one
    that was there before stays."""
    from eval import runner

    def interrupted(job):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_job", interrupted)
    out = tmp_path / "out"
    if existed:
        out.mkdir()
    assert main(["demo", "--seconds", "0.5", "--controllers", "eq", "--out", str(out)]) == 130
    assert out.exists() == existed
