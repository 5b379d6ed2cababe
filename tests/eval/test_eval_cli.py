"""``rdtune eval`` end to end (serial, on Ray local mode, against a real agent on loopback)
and ``rdtune bench``."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from eval.report import write_report
from eval.runner import Job, run_job, run_jobs
from eval.suites import get_suite
from models.policy import DEFAULT_POLICY
from tests.models.exports import copy_export, non_finite_export, resign
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _report(out: Path) -> tuple[str, list[dict]]:
    data = json.loads((out / "results.json").read_text())
    return (out / "report.md").read_text(), data["runs"]


def test_smoke_suite_serial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["eval", "--suite", "smoke", "--ray-address", "none", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["rdtune", *argv])  # the report names this command
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "4 runs (serial)" in out and f"report: {tmp_path}/report.md" in out
    md, runs = _report(tmp_path)
    assert len(runs) == 4 and not any(r["error"] for r in runs)
    assert {(r["controller"], r["seed"]) for r in runs} == {
        (c, s) for c in ("unpartitioned", "eq") for s in (0, 1)
    }
    assert "| eq | 2 |" in md and (tmp_path / "tradeoff.png").is_file()
    # the paired table: the first controller (no policy here) against the other
    assert "paired: unpartitioned minus each controller" in out and "1 scenarios x 2 seeds" in out
    assert "## Paired comparison: unpartitioned vs each controller" in md
    paired = json.loads((tmp_path / "results.json").read_text())["paired"]
    assert paired["reference"] == "unpartitioned" and paired["rows"][0]["pairs"] == 2
    # the command that made it, --force added: run as written, it replaces this report
    assert f"    rdtune eval --suite smoke --ray-address none --out {tmp_path} --force\n" in md
    (tmp_path / "report.md").unlink()
    assert main(["eval", "--rerender", str(tmp_path)]) == 0  # from results.json, no runs
    # the same report: the command that made the runs, not one from the suite's name
    assert (tmp_path / "report.md").read_text() == md
    assert main(["eval", "--rerender", str(tmp_path / "nowhere")]) == 2
    # the report's own flags apply to a rerender too (they were ignored)
    assert main(["eval", "--rerender", str(tmp_path), "--paired-with", "eq", "--no-plots"]) == 0
    assert "## Paired comparison: eq vs each controller" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "tradeoff.png").exists()
    assert main(["eval", "--rerender", str(tmp_path), "--paired-with", "ucp"]) == 2
    assert "--paired-with 'ucp': no runs of it; have eq, unpartitioned" in capsys.readouterr().err
    # what only a run uses is refused, not ignored, and the report is left as it was
    before = (tmp_path / "report.md").read_text()
    for extra in (["--seeds", "5"], ["--controllers", "eq", "--seconds", "2"], ["--force"]):
        assert main(["eval", "--rerender", str(tmp_path), *extra]) == 2
        err = capsys.readouterr().err
        assert "would have no effect" in err
        assert all(o in err for o in extra if o.startswith("--")), err
    assert (tmp_path / "report.md").read_text() == before


def test_a_paired_with_whose_every_run_failed_still_gives_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs of the --paired-with controller all failed (a policy that breaks at run
    time, say): the report of the others is written and says why it has no paired table;
    before, the command exited 2 after every run, as if its usage were wrong."""
    import dataclasses

    import eval.cli

    def runs_with_eq_failing(console, jobs, ray_address, out, made_by):
        results = run_jobs(jobs, "none")
        return [
            dataclasses.replace(r, error="RuntimeError: boom") if r.controller == "eq" else r
            for r in results
        ]

    monkeypatch.setattr(eval.cli, "run_saving", runs_with_eq_failing)
    argv = ["eval", "--suite", "smoke", "--seconds", "1", "--no-plots", "--out", str(tmp_path)]
    assert main([*argv, "--paired-with", "eq"]) == 0  # the other controller's runs completed
    out = capsys.readouterr().out
    assert "paired: every run of eq failed; no paired table" in out
    md, runs = _report(tmp_path)
    assert 'None: every run of eq failed (see "Failed runs").' in md
    assert "## Failed runs" in md and len(runs) == 4
    assert main([*argv, "--force", "--controllers", "eq", "--paired-with", "eq"]) == 1  # all


@pytest.mark.xdist_group("ray")  # beside the Ray tests sharing one Ray (tests/conftest.py)
def test_smoke_suite_on_ray_local_matches_serial(ray_local) -> None:
    import ray

    jobs = get_suite("smoke").jobs(seconds=1.0)
    serial = run_jobs(jobs, "none")
    on_ray = run_jobs(jobs, "local")
    assert ray.is_initialized()  # a Ray the caller started is left running
    assert [r.controller for r in on_ray] == ["unpartitioned"] * 2 + ["eq"] * 2  # job order
    for a, b in zip(serial, on_ray, strict=True):
        assert not a.error and not b.error
        keys = set(a.metrics) - {"decide_us_median"}  # wall-clock timing differs
        assert {k: a.metrics[k] for k in keys} == pytest.approx(
            {k: b.metrics[k] for k in keys}, nan_ok=True
        )


def test_failed_job_is_recorded_not_raised() -> None:
    r = run_job(Job("t", "default", "coco", 0, 1.0))
    assert r.error == ""  # coco gets a bare node and works
    r = run_job(Job("t", "default", "static[ways=99]", 0, 1.0))
    assert r.error  # 99 ways cannot be applied; the run is marked, not lost
    assert run_job(Job("t", "default", "eq", 0, 1.0)).slo_judged == "windows"


def test_tail_alone_is_the_service_alone_over_the_whole_run() -> None:
    """The reference of "tail / alone" is measured over the run's length: memcached's load
    in copart_memcached steps up after 99 s, which the run's first 5 s never see."""
    from agent.sim import SimNode
    from eval.metrics import sim_alone_tails

    job = Job("t", "copart_memcached", "eq", 0, 120.0, interval_s=1.0)
    r = run_job(job)
    node = SimNode(job.scenario, seed=job.seed, interval_s=0.1)
    whole = sim_alone_tails(node, seconds=job.seconds, interval_s=job.interval_s)
    first = sim_alone_tails(node, seconds=5.0, interval_s=job.interval_s)
    assert r.lc_alone_ms == pytest.approx(whole) and whole["memcached"] > first["memcached"]


def test_agent_run_on_loopback(agent_address: str, tmp_path: Path) -> None:
    args = [
        "eval",
        "--suite",
        "smoke",
        "--controllers",
        "eq,static",
        "--seeds",
        "1",
        "--seconds",
        "2",
        "--agent",
        agent_address,
        "--out",
        str(tmp_path),
        "--no-plots",  # the report's plots: test_smoke_suite_serial
    ]
    assert main(args) == 0
    _, runs = _report(tmp_path)
    assert [r["controller"] for r in runs] == ["eq", "static"]
    for r in runs:
        assert not r["error"], r["error"]
        assert len(r["timeline_t"]) == 20  # 2 s of 0.1 s intervals through the agent
        assert r["metrics"]["weighted_speedup"] > 0  # references from the local twin
    static = runs[1]
    assert static["timeline_ways"]["memcached"][-1] < 11  # the mite got its own low ways


def test_eval_errors_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--suite", "nope"]) == 2
    assert "unknown suite 'nope'" in capsys.readouterr().err
    assert main(["eval", "--suite", "smoke", "--controllers", "eq,bogus"]) == 2
    assert "unknown controller 'bogus'" in capsys.readouterr().err
    # before: every run started, and failed, each with the same ValueError
    assert main(["eval", "--suite", "smoke", "--controllers", "eq[decide_s=abc]"]) == 2
    assert "decide_s must be a number of seconds > 0" in capsys.readouterr().err
    assert main(["eval"]) == 2


@pytest.mark.parametrize("cmd", ["eval", "bench"])
def test_help(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([cmd, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out if cmd == "bench" else "--suite" in out and "--ray-address" in out
    if cmd == "eval":  # a failed run among completed ones is no failure of the command
        assert "exit status: 0 when at least one run completed" in " ".join(out.split())


def test_list_suites(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--list"]) == 0
    out = capsys.readouterr().out
    assert "copart" in out and "CAT-only" in out


# The benchmarks that run in seconds, each through the command a reader of
# docs/BENCHMARKS.md types: one that stops running (a renamed scenario, a moved function)
# fails here, not when its figures are next wanted. The dearer ones have tests of their own
# parts (test_bench_bare.py, test_bench_controllers.py, test_bench_training.py).
@pytest.mark.parametrize(
    ("name", "unit"), [("sim", "steps/s"), ("policy", " us "), ("traces", "/s"), ("pmc", " us ")]
)
def test_bench_quick(name: str, unit: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", name]) == 0
    out = capsys.readouterr().out
    assert "machine:" in out and unit in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "unknown benchmark(s) ['nope']; have ["),
        (["--set", "foo", "training"], "--set wants KEY=VALUE, got 'foo'"),
        (["--set", "ppo.n_epochs={", "training"], "--set 'ppo.n_epochs={': bad value for 'ppo"),
        (["sim", "--set", "n_envs=8"], "--config and --set apply to the training benchmark"),
        (["--set", "ppo.n_epochs=-1", "training"], "overrides: ppo.n_epochs: must be greater"),
        (["--config", "absent.yaml", "training"], "absent.yaml: cannot read"),
        (["--json", "/nonexistent/b.json", "sim"], "--json /nonexistent/b.json: /nonexistent is"),
        # found out after the benchmark before: a directory in the way, and /proc (root's
        # W_OK says yes, a write says no)
        (["--json", "/tmp", "sim"], "--json /tmp: a directory is in the way"),
        (["--json", "/proc/b.json", "sim"], "--json /proc/b.json: "),
    ],
)
def test_bench_refuses_bad_input_before_running(args: list[str], message: str, capsys) -> None:
    assert main(["bench", "--quick", *args]) == 2
    out, err = capsys.readouterr()
    assert "machine:" not in out  # nothing ran
    assert err.startswith(f"rdtune bench: {message}") and err.count("\n") == 1, err


def test_time_sharing_is_judged_per_service() -> None:
    r = run_job(Job("t", "more_lc_than_closids_epyc", "round_robin", 0, 2.0))
    assert not r.error, r.error
    services = {"memcached_coco", "nginx", "mongodb", "specjbb", "shore_mt"}
    assert set(r.lc_tails_ms) == services  # each service by its own SLO, not per tier group
    assert r.slo_judged == "services"
    assert set(r.timeline_ways) == services
    # round robin rotates the big tier: some service's ways change over the run
    assert any(len(set(w)) > 1 for w in r.timeline_ways.values())


def test_services_are_judged_by_the_scenarios_slo() -> None:
    from agent.sim import SimNode
    from eval.runner import _ServiceProbe

    # lc_batch_60 sets xapian's target to 8 ms; the catalog's is 5 ms
    assert _ServiceProbe(SimNode("lc_batch_60", 0))._slo["xapian"] == (99.0, 8.0)


@pytest.mark.parametrize("controller", ["oracle", "eq"])
def test_services_left_in_the_default_group_are_judged_too(controller: str) -> None:
    """Five LC services on four CLOSIDs: the scenario's groups hold three of them, the
    other two run in the default group. Every one is judged by its own SLO, as the
    time-sharing controllers of the same suite are; the groups keep their timeline."""
    r = run_job(Job("t", "more_lc_than_closids_e5v3", controller, 0, 2.0))
    assert not r.error, r.error
    services = {"memcached_coco", "nginx", "mongodb", "specjbb", "xapian"}
    assert set(r.lc_tails_ms) == services and r.slo_judged == "services"
    assert set(r.timeline_ways) == {"memcached_coco", "nginx", "mongodb"}
    assert math.isfinite(r.metrics["slo_violation_rate"])
    # what decides that the run has a rate (eval/report.py): not its tail, which an
    # overloaded service makes infinite; five services, every interval
    assert r.metrics["slo_intervals_judged"] >= 5 * 20


def test_bench_failure_is_reported_and_the_rest_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys
    import types

    from eval import bench
    from eval.bench.harness import Result

    # a benchmark module that does not exist stands in for one that breaks; the one after
    # it is a stand-in too (a real one takes ~20 s; test_bench_quick runs the sim's)
    monkeypatch.setitem(bench.BENCHMARKS, "broken", "no_such_module")
    fine = types.ModuleType("eval.bench.fine_for_test")
    fine.run = lambda quick: [
        Result(f"fine, quick={quick}", 42.0, "steps/s", 3),
        Result("latency", 1.5, "ms", 100, p99=2.25),  # the p99 in the median's unit
    ]
    monkeypatch.setitem(sys.modules, fine.__name__, fine)
    monkeypatch.setitem(bench.BENCHMARKS, "fine", "fine_for_test")
    kept = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(kept), "broken", "fine"]) == 1
    out = capsys.readouterr()
    # the same rows as JSON, and which benchmark failed and why
    doc = json.loads(kept.read_text())
    assert doc["machine"] in out.out and doc["failed"]["broken"].startswith("ModuleNotFound")
    assert doc["results"][1] == {
        "benchmark": "fine", "name": "latency", "value": 1.5, "unit": "ms", "repeats": 100,
        "p99": 2.25, "target": "",
    }  # fmt: skip
    assert "| broken: failed (ModuleNotFoundError" in out.out
    assert "| fine, quick=True | 42 steps/s | - | 3 |" in out.out  # the rest still ran
    assert "| latency | 1.5 ms | 2.25 ms | 100 |" in out.out
    assert "failed: broken" in out.err


def test_one_decision_a_second_keeps_the_simulators_resolution() -> None:
    r = run_job(Job("t", "default", "eq", 0, 3.0, interval_s=1.0))
    assert not r.error, r.error
    assert r.timeline_t == [1.0, 2.0, 3.0]
    assert 0.5 < r.metrics["tail_normalized"] < 5  # reference measured over 1 s windows too


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["eval", "--suite", "smoke", "--paired-with", "nope"], "--paired-with 'nope'"),
        (["eval", "--suite", "smoke", "--scenarios", "nope"], "unknown scenario 'nope'"),
        (["demo", "--scenario", "nope"], "unknown scenario 'nope'"),
        # the demo ran every controller and ended with exit 1 and the reason in a warning
        (["demo", "--controllers", "eq,policy[path=/dev/zero]"], "a character device"),
        (["demo", "--controllers", "eq[foo=1]"], "unknown option(s) foo"),
        # each of these ran the whole suite, or every run to fail in turn
        (["eval", "--suite", "smoke", "--controllers", ""], "--controllers '': names no"),
        (["eval", "--suite", "smoke", "--scenarios", ""], "--scenarios '': names no"),
        (
            ["eval", "--suite", "smoke", "--scenarios", "default,default"],
            "--scenarios names default more than once",  # two samples of one run
        ),
        (
            ["eval", "--suite", "smoke", "--controllers", "eq[foo=1]"],
            "controller 'eq[foo=1]': unknown option(s) foo; it takes decide_s",
        ),
    ],
)
def test_bad_reference_or_scenario_is_refused_before_any_run(
    args: list[str], error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = [*args, "--seconds", "0.5", "--out", str(out)]
    if args[0] == "eval":
        argv += ["--ray-address", "none"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and error in captured.err
    assert "running" not in captured.out and "[1/" not in captured.out
    assert not out.exists()


def test_runs_are_saved_before_the_report_can_fail(tmp_path: Path) -> None:
    results = [run_job(Job("t", "default", c, 0, 0.5)) for c in ("unpartitioned", "eq")]
    with pytest.raises(ValueError, match="no runs of 'nope'"):
        write_report(results, tmp_path, title="t", reference="nope", plots=False)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["controller"] for r in runs] == ["unpartitioned", "eq"]


def test_unreachable_ray_cluster_is_one_line_soon(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        cmd = [sys.executable, "-m", "tuner.cli", "eval", "--suite", "smoke", "--seconds", "0.5",
               "--ray-address", address, "--out", str(tmp_path / "out")]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"rdtune eval: cannot reach the Ray cluster at {address}" in done.stderr
    assert done.stderr.count("\n") == 1


def _smoke(out: Path, *more: str) -> list[str]:
    return ["eval", "--suite", "smoke", "--seconds", "0.5", "--seeds", "1", "--ray-address",
            "none", "--out", str(out), *more]  # fmt: skip


def _refused_before_any_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("rdtune eval: ")
    assert "[1/" not in captured.out
    return captured.err


@pytest.mark.parametrize("where", ["a file", "under a file", "under /proc"])
def test_an_out_that_cannot_hold_the_report_is_refused_before_any_run(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    out = {
        "a file": tmp_path / "file",
        "under a file": tmp_path / "file" / "report",
        "under /proc": Path("/proc/rdtune-eval-test"),
    }[where]
    err = _refused_before_any_run(_smoke(out), capsys)
    assert f"--out {out}: " in err


def _train_run(tmp: Path) -> Path:
    (tmp / "run").mkdir()
    (tmp / "run" / "config.yaml").write_text("algorithm: MaskablePPO\n")
    return tmp / "run"


def _cut_onnx(tmp: Path, keep: float) -> Path:
    bad = copy_export(DEFAULT_POLICY, tmp / "cut")
    data = (bad / "policy.onnx").read_bytes()
    (bad / "policy.onnx").write_bytes(data[: int(len(data) * keep)])
    return resign(bad)


def _wrong_sha(tmp: Path) -> Path:
    return copy_export(DEFAULT_POLICY, tmp / "x", **{"runtime.onnx.sha256": "0" * 64})


def _old_card(tmp: Path) -> Path:
    return copy_export(DEFAULT_POLICY, tmp / "old", format="rdtune-policy-0")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda tmp: tmp / "missing", "no such file or directory", id="missing"),
        pytest.param(_train_run, "no model card", id="train-run"),
        pytest.param(lambda tmp: _cut_onnx(tmp, 0.5), "not an ONNX model", id="truncated"),
        pytest.param(lambda tmp: _cut_onnx(tmp, 0.0), "not an ONNX model", id="empty"),
        pytest.param(_wrong_sha, "does not match the card's sha256", id="sha"),
        pytest.param(
            lambda tmp: non_finite_export(DEFAULT_POLICY, tmp / "nan"),
            "weights are not finite",
            id="nan-weights",
        ),
        pytest.param(_old_card, "model card format", id="card"),
    ],
)
def test_an_unusable_policy_is_refused_before_any_run(
    make, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make(tmp_path)
    err = _refused_before_any_run(
        _smoke(tmp_path / "out", "--controllers", f"eq,policy[path={path}]"), capsys
    )
    assert f"controller 'policy[path={path}]'" in err and message in err


@pytest.mark.parametrize("interrupt_at", [1, 3])
def test_an_interrupted_eval_keeps_the_runs_that_finished(
    interrupt_at: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from eval import cli as eval_cli
    from eval import runner

    monkeypatch.setattr(eval_cli, "SAVE_EVERY_S", 0.0)  # save after every run
    real, calls = runner.run_job, []

    def run_job(job: Job):
        calls.append(job)
        if len(calls) == interrupt_at:
            if interrupt_at > 1:  # what finished is on disk already
                assert len(json.loads(rj.read_text())["runs"]) == interrupt_at - 1
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(runner, "run_job", run_job)
    out = tmp_path / "out"  # made by the eval
    rj = out / "results.json"
    argv = ["eval", "--suite", "smoke", "--seconds", "0.5", "--ray-address", "none",
            "--out", str(out), "--no-plots"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["rdtune", *argv])
    assert main(argv) == 130
    err = capsys.readouterr().err
    finished = interrupt_at - 1
    assert (
        err.count("\n") == 1 and f"rdtune eval: interrupted; {finished} of 4 runs finished" in err
    )
    if not finished:  # the --out it made is not left behind, empty
        assert not out.exists()
        return
    data = json.loads(rj.read_text())
    assert data["partial"] is True and len(data["runs"]) == finished
    for _ in range(2):  # a report of them stays marked partial, rerendered again too
        assert main(["eval", "--rerender", str(out)]) == 0
        assert "unfinished suite" in " ".join(capsys.readouterr().out.split())  # wrapped
    assert json.loads(rj.read_text())["partial"] is True
    md = (out / "report.md").read_text()
    assert "**Partial**" in md and f"--out {out} --no-plots --force\n" in md  # run again


def test_a_rerender_of_results_that_keep_no_command_names_the_suites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text(_one_run())  # as written before they kept it
    assert main(["eval", "--rerender", str(tmp_path), "--no-plots"]) == 0
    assert "    rdtune eval --suite t\n" in (tmp_path / "report.md").read_text()


def test_a_rerender_of_runs_that_all_failed_exits_as_their_evaluation_did(
    tmp_path: Path,
) -> None:
    """The evaluation that made them exited 1; its rerender exited 0."""
    (tmp_path / "results.json").write_text(_one_run(error="ValueError: boom"))
    assert main(["eval", "--rerender", str(tmp_path), "--no-plots"]) == 1


def _one_run(**change) -> str:
    run = {"suite": "t", "scenario": "default", "controller": "eq", "controller_name": "eq",
           "options": {}, "seed": 0, "metrics": {"weighted_speedup": 2.5},
           "timeline_t": [0.0, 1.0], "timeline_ways": {"lc": [4, 5]}}  # fmt: skip
    for key, value in change.items():
        if "." in key:
            outer, inner = key.split(".")
            run[outer] = {**run[outer], inner: value}
        else:
            run[key] = value
    return json.dumps({"runs": [run]})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", 'no "runs" key'),
        ('{"runs": [{}]}', 'run 1 has no "metrics" mapping'),
        # hand edits: each was a traceback, after the old plots were deleted
        (_one_run(**{"metrics.weighted_speedup": "2.75"}), "'metrics.weighted_speedup' is '2.75'"),
        (_one_run(**{"metrics.weighted_speedup": True}), "'metrics.weighted_speedup' is True"),
        (_one_run(controller=None), "run 1: 'controller' is None, not of type str"),
        (_one_run(seed="0"), "run 1: 'seed' is '0', not of type int"),
        (_one_run(options=None), "run 1: 'options' is None"),
        (_one_run(extra=1), "run 1: 'extra' is not a key of a run"),
        (_one_run(feasibility="maybe"), "'feasibility' is 'maybe'"),
        (_one_run(oracle_plannable="yes"), "'oracle_plannable' is 'yes': true, false or null"),
        (_one_run(**{"timeline_ways.lc": [4]}), "'timeline_ways.lc' does not hold one value"),
    ],
)
def test_rerender_names_what_results_json_lacks(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text(content)
    (tmp_path / "tradeoff.png").write_bytes(b"kept")
    assert main(["eval", "--rerender", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert (tmp_path / "tradeoff.png").read_bytes() == b"kept"  # refused before anything


def test_a_report_is_not_replaced_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run of a second command overwrote results.json, and the old Markdown and
    plots stayed beside it: the directory described runs it no longer held."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    (out / "report.md").write_text("# old\n")
    (out / "tradeoff.png").write_bytes(b"old")
    (out / "notes.txt").write_text("mine\n")
    err = _refused_before_any_run(_smoke(out), capsys)
    assert f"--out {out}: holds a report already (results.json, report.md)" in err
    assert (out / "report.md").read_text() == "# old\n"
    assert main([*_smoke(out, "--force"), "--no-plots"]) == 0
    assert (out / "report.md").read_text() != "# old\n"
    assert not (out / "tradeoff.png").exists()  # the old report's plot went with it
    assert (out / "notes.txt").read_text() == "mine\n"  # what is not a report's stays


@pytest.mark.parametrize(("name", "status"), [("t", 0), ("other", 2)])
def test_a_rerender_takes_the_runs_suite_from_suites_file(
    name: str, status: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--suites was ignored by --rerender: the report lost a user suite's description."""
    suites = tmp_path / "suites.yaml"
    suites.write_text(
        f"{name}:\n  description: Hand-made suite\n  scenarios: [default]\n  controllers: [eq]\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(_one_run())  # runs of suite t
    assert main(["eval", "--rerender", str(out), "--suites", str(suites), "--no-plots"]) == status
    if status == 0:
        assert "\nHand-made suite\n" in (out / "report.md").read_text()
        return
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--suites {suites}: no suite 't' (the runs'); have other" in err
    assert not (out / "report.md").exists()
