"""Ray scale-out: sweep parsing, and a real Ray (local mode) sweep of two tiny trials plus
parallel rollouts."""

from __future__ import annotations

import json
import signal

import pytest

from tests.training.tiny_runs import tiny_config
from training.sweep import SweepError, combinations, parse_sweep, trial_name


def test_parse_sweep_aliases_and_types():
    grid = parse_sweep(["seeds=0,1,2", "lr=3e-4,1e-3", "ppo.n_epochs=2"])
    assert grid == {
        "seed": [0, 1, 2],
        "ppo.learning_rate": [3e-4, 1e-3],
        "ppo.n_epochs": [2],
    }
    combos = combinations(grid)
    assert len(combos) == 6 and combos[0] == {
        "seed": 0,
        "ppo.learning_rate": 3e-4,
        "ppo.n_epochs": 2,
    }
    assert trial_name(combos[0]) == "seed=0_learning_rate=0.0003_n_epochs=2"
    assert combinations({}) == [{}]


@pytest.mark.parametrize(
    ("items", "message"),
    [(["seeds"], "expected KEY=V1,V2"), (["=1"], "expected KEY"), (["seeds=1", "seed=2"], "twice")],
)
def test_parse_sweep_errors(items, message):
    with pytest.raises(SweepError, match=message):
        parse_sweep(items)


def test_bad_sweep_values_fail_before_ray_starts(tmp_path):
    import ray

    from training.sweep import run_sweep

    if ray.is_initialized():  # the shared Ray of an earlier test in this process (conftest)
        ray.shutdown()
    cfg = tiny_config(tmp_path / "run")
    with pytest.raises(SweepError, match=r"ppo\.learning_rate"):
        run_sweep(cfg, {"ppo.learning_rate": ["fast"]})
    assert not ray.is_initialized()


@pytest.mark.xdist_group("ray")
def test_ray_local_sweep_and_parallel_rollouts(tmp_path, ray_local):
    import ray

    from training.sweep import parallel_rollouts, run_sweep

    cfg = tiny_config(tmp_path / "tiny", total_timesteps=64)
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    # one trial at a time: the second runs in the first one's worker (reuse_actors), which
    # spares a worker start (Ray, torch, SB3: ~10 s of CPU); both are still Tune trials
    result = run_sweep(cfg, {"seed": [0, 1]}, max_concurrent=1)
    assert ray.is_initialized()  # a Ray the caller started is left running
    # Tune's Ctrl-C handler ends with its run: the process's own are back
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == handlers
    rollouts = parallel_rollouts(cfg.eval_kwargs(), ["eq", "unpartitioned"], episodes=2, seed=5)
    # one experiment folder, one run directory per trial, a summary
    assert result.experiment_dir == (tmp_path / "tiny-sweep")
    assert [t["trial"] for t in result.trials] == ["seed=0", "seed=1"]
    for t in result.trials:
        assert t["status"] == "done", t["error"]
        assert t["final_return"] is not None and t["best_return"] is not None
        run = tmp_path / "tiny-sweep" / t["trial"] / "run"
        assert (run / "best_model.zip").is_file() and (run / "eval.json").is_file()
        meta = json.loads((run / "run.json").read_text())
        assert meta["seed"] == t["overrides"]["seed"]
        # the command that trains the trial's policy again, as a single run records its own
        assert meta["command"] == f"rdtune train --config {run / 'config.yaml'}"
    saved = json.loads((result.experiment_dir / "sweep.json").read_text())
    assert len(saved) == 2
    assert "| seed=0 | done |" in result.summary()
    assert set(rollouts) == {"eq", "unpartitioned"}
    assert all(r.episodes == 2 for r in rollouts.values())
