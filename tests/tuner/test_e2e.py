"""End to end: ``rdtune agent`` (sim backend) as a process and ``rdtune tune`` over loopback
gRPC -- every registered heuristic, the SLO guard tripping on a load spike and recovering,
the agent killed and restarted mid-run, the tuner killed or stopped cleanly. The tuner runs
as its own process where the process matters (signals, kills, outages, the load spike);
elsewhere its command runs in this process (``tune_here``), talking to the agent the same
way."""

from __future__ import annotations

import signal
import time

import pytest

from models import catalogue
from tests.tuner.conftest import (
    ROOT,
    assert_valid,
    free_port,
    run_tune,
    start_agent,
    start_agent_with,
    start_tune,
    wait_for,
)
from tuner.status import read_metrics

# Controllers a remote node cannot run, and what the refusal names.
REFUSED = {"oracle": "needs ground truth"}
if not (ROOT / "models" / "policies" / "default" / "model_card.json").is_file():
    REFUSED["policy"] = "no model card"
# Options a controller cannot do without on the default scenario (what an operator configures).
OPTIONS = {"static": {"lc_group": "memcached", "ways": 4}, "best_static": {"max_evals": 10}}
# Controllers calibrated on the agent's node at start (--calibrate): it steps the clock.
CALIBRATE = {"ubik", "static_lc", "best_static", "coco"}


def time_sharing_config(node) -> dict:
    """CoCo / round robin: memcached is the service; the config creates the tier groups."""
    slo = node.groups()["memcached"].slo
    slo_data = {"percentile": slo.percentile, "target_ms": slo.target_ms}
    tiers = ["coco_bg", "coco_t1", "coco_t2"]
    return {
        "groups": [{"name": tiers[0], "kind": "system"}]
        + [{"name": g, "kind": "lc", "slo": slo_data} for g in tiers[1:]],
        "controller_options": {
            "services": [
                {"name": "memcached", "pids": sorted(node.tasks("memcached")), "slo": slo_data}
            ],
            "groups": tiers,
        },
    }


CONFIGS = {"coco": time_sharing_config, "round_robin": time_sharing_config}


@pytest.mark.parametrize("name", catalogue.names())
def test_each_controller_drives_a_remote_sim_node_or_is_refused(
    fresh, tune_here, name: str
) -> None:
    """Every controller ``rdtune eval`` knows, through ``rdtune tune --controller NAME``."""
    if name in CONFIGS:
        with fresh.node() as node:
            config = CONFIGS[name](node)
    else:
        config = {"controller_options": OPTIONS.get(name, {})}
    args = ("--calibrate",) if name in CALIBRATE else ()
    run = tune_here(
        fresh.address, name, "--interval", "0.1", "--intervals", "40", *args, config=config
    )
    if name in REFUSED:
        assert run.returncode == 2 and REFUSED[name] in run.stderr, run.stderr
        assert f"controller {name!r} cannot run on this node" in run.stderr
        return
    if run.returncode == 2 and "bad options" in run.stderr and name not in OPTIONS:
        pytest.fail(f"{name} needs options: add them to OPTIONS in this file ({run.stderr})")
    assert run.returncode == 0, run.stderr
    assert run.summary["intervals"] == 40
    assert run.summary["controller"] == name
    assert not run.of("dropped"), f"{name} decided invalid plans: {run.of('dropped')}"
    with fresh.node() as node:
        assert_valid(node)
        if name in CALIBRATE:
            assert node.now() > 4.0, "calibration ran on the node"
        else:
            assert node.now() == pytest.approx(4.0 + 0.0, abs=1e-6), "the tuner stepped the clock"


@pytest.mark.parametrize(("name", "skip"), [("static", "lc_group and ways"), ("ubik", "profiles")])
def test_calibration_on_the_live_node_needs_consent(fresh, tune_here, name, skip) -> None:
    run = tune_here(fresh.address, name, "--intervals", "3")
    assert run.returncode == 2
    assert f"give {skip} in its options" in run.stderr and "--calibrate" in run.stderr
    with fresh.node() as node:
        assert node.now() == 0.0, "nothing ran on the node"


def test_unknown_controller_is_refused_with_the_choices(fresh, tune_here) -> None:
    run = tune_here(fresh.address, "no-such-heuristic", "--intervals", "1")
    assert run.returncode == 2
    assert "unknown controller 'no-such-heuristic'" in run.stderr
    assert "eq" in run.stderr


@pytest.mark.parametrize(
    ("config", "flag", "runs", "refusal"),
    [
        ({"controller": "eq"}, None, "eq", None),  # the config file names it
        ({"controller": "eq"}, "unpartitioned", "unpartitioned", None),  # the flag wins
        ({}, None, None, "no controller: give --controller SPEC, or controller: in the --config"),
        # a typo in the file is named, not reported as a missing --controller
        ({"controler": "eq"}, None, None, "controler: unknown key"),
    ],
)
def test_the_controller_comes_from_the_flag_or_the_config_file(
    fresh, tune_here, config: dict, flag: str | None, runs: str | None, refusal: str | None
) -> None:
    run = tune_here(fresh.address, flag, "--intervals", "1", config=config)
    if refusal is None:
        assert run.returncode == 0, run.stderr
        assert f"rdtune tune: {runs} on {fresh.address}" in run.stdout
    else:
        assert run.returncode == 2 and refusal in run.stderr, run.stderr


def test_load_spike_trips_the_guard_and_it_recovers(spike_file: str) -> None:
    agent = start_agent(spike_file)
    try:
        config = {"guard": {"violation_intervals": 3, "stable_intervals": 8}}
        # the operator's static allocation (from a sweep)
        config["fallback"] = "static"
        config["fallback_options"] = {"lc_group": "memcached", "ways": 6}
        expected = "static"
        run = run_tune(
            agent.address, "eq", "--interval", "0.1", "--intervals", "140", config=config
        )
        assert run.returncode == 0, run.stderr
        switches = run.summary["switches"]
        assert [s["to_fallback"] for s in switches] == [True, False], switches
        assert switches[0]["groups"] == ["memcached"]
        trip, back = run.of("switch")
        assert trip["to"] == run.summary["fallback"] == expected
        assert trip["tripped_by"] == ["memcached"]
        assert back["to"] == "eq" and "no SLO violation for 8 intervals" in back["reason"]
        with agent.node() as node:
            assert node.now() == pytest.approx(14.0)
            assert_valid(node)
    finally:
        agent.stop()


def test_agent_killed_and_restarted_mid_run(spike_file: str) -> None:
    agent = start_agent("default")
    port = agent.address.rsplit(":", 1)[1]
    config = {"realtime": True, "retry": {"initial_s": 0.05, "max_s": 0.2}}
    tune = start_tune(
        agent.address, "eq", "--interval", "0.05", "--metrics-listen", "127.0.0.1:0",
        config=config,
    )  # fmt: skip
    try:
        assert tune.metrics_url, tune.stdout

        def intervals() -> float:
            return sum(v for _, v in read_metrics(tune.metrics_url)["rdtune_tuner_intervals_total"])

        wait_for(lambda: intervals() >= 10)
        with agent.node() as node:
            held = assert_valid(node)
            full = node.capabilities().l3.cbm_mask
        assert all(a.l3_mask != full for p in held.groups.values() for a in p.values())
        agent.kill()
        time.sleep(0.5)  # the tuner finds the agent gone and backs off
        before = intervals()
        agent = start_agent("default", port=int(port))
        # A restarted sim agent starts over with every group at full allocation; the tuner
        # reconnects and puts back what it had applied.
        wait_for(lambda: read_metrics(tune.metrics_url)["rdtune_tuner_reconnects_total"][0][1] >= 1)
        wait_for(lambda: intervals() >= before + 10)
        with agent.node() as node:
            after = assert_valid(node)
        assert after == held, "the node holds the tuner's allocation again"
        m = read_metrics(tune.metrics_url)
        assert sum(v for _, v in m["rdtune_tuner_agent_errors_total"]) >= 1
        assert m["rdtune_tuner_agent_up"][0][1] == 1
    finally:
        tune.stop()
        agent.stop()
    assert tune.returncode == 0, tune.stderr
    assert tune.of("agent_down") and tune.of("agent_up") and tune.of("restored")
    assert tune.summary["intervals"] > before, "interval count carried on across the outage"


BAD_FALLBACK = {"fallback": "static", "fallback_options": {"lc_group": "nosuch", "ways": 2}}


@pytest.mark.parametrize(
    ("controller", "error", "extra"),
    [
        ("import:tests.tuner.controllers:BuggyStart", "unexpected error: ZeroDivisionError", {}),
        ("coco", "option 'services': services must be a non-empty list", {}),
        # found at start, not when the SLO guard trips and the LC groups need it
        ("eq", "the fallback controller static cannot control this node: ", BAD_FALLBACK),
    ],
    ids=["a bug", "bad options", "a fallback for another node"],
)
def test_a_controller_that_fails_to_start_leaves_the_node_as_it_was(
    fresh, tune_here, controller, error, extra
) -> None:
    """A bug (exit 1, its traceback logged) or bad options (exit 2): either way the groups
    the tuner made for it are gone again, and the summary line still says what ran."""
    with fresh.node() as node:
        groups, held = set(node.groups()), node.allocation()
    config = {
        "groups": [{"name": "tier", "kind": "batch"}],
        "controller_options": {"services": 5} if controller == "coco" else {},
        **extra,
    }
    run = tune_here(fresh.address, controller, "--intervals", "3", config=config)
    assert run.returncode == (1 if "unexpected" in error else 2), run.stderr
    assert error in run.stderr
    assert run.summary is not None and run.summary["intervals"] == 0
    with fresh.node() as node:
        assert set(node.groups()) == groups and node.allocation() == held


def test_invalid_plans_are_dropped_and_counted(fresh, tune_here) -> None:
    run = tune_here(
        fresh.address, "import:tests.tuner.controllers:Broken", "--interval", "0.1",
        "--intervals", "10",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    # every refused plan counted, one reported: the controller proposes the same refused
    # plan every other interval, and the log said so every time
    dropped = run.of("dropped")
    assert len(dropped) == 1 and dropped[0]["rule"] == "contiguous"
    assert run.summary["dropped"] == 5
    with fresh.node() as node:
        alloc = assert_valid(node)
        caps = node.capabilities()
    hole = caps.l3.cbm_mask & ~0b10
    assert all(a.l3_mask != hole for p in alloc.groups.values() for a in p.values())


@pytest.mark.parametrize("restore", [True, False])
def test_clean_shutdown_restores_the_baseline_when_asked(fresh, tune_here, restore) -> None:
    with fresh.node() as node:
        baseline = node.allocation()
    args = ["--interval", "0.1", "--intervals", "5"] + (["--restore-baseline"] if restore else [])
    run = tune_here(fresh.address, "eq", *args)
    assert run.returncode == 0, run.stderr
    assert run.summary.get("restored") is (True if restore else None)
    with fresh.node() as node:
        after = assert_valid(node)
    if restore:
        assert after == baseline
    else:
        assert after != baseline, "without the flag the node keeps the tuner's allocation"


def test_a_restore_lost_with_the_agent_is_in_the_summary_and_the_exit_status() -> None:
    agent = start_agent()
    config = {"realtime": True, "retry": {"initial_s": 0.2, "max_s": 0.5}, "restore_deadline_s": 1}
    tune = start_tune(agent.address, "eq", "--interval", "0.1", "--restore-baseline", config=config)
    try:
        with agent.node() as node:
            baseline = node.allocation()
            wait_for(lambda: node.allocation() != baseline)  # the tuner has started
    finally:
        agent.kill()
    run = tune.stop()
    assert run.returncode == 3, run.stderr
    assert run.summary["restored"] is False
    assert len(run.of("restore_failed")) == 1


def test_killed_tuner_leaves_the_last_valid_allocation(fresh) -> None:
    config = {"realtime": True}
    tune = start_tune(
        fresh.address, "eq", "--interval", "0.05", "--restore-baseline", config=config
    )
    with fresh.node() as node:
        baseline = node.allocation()
        held = wait_for(lambda: (a := node.allocation()) != baseline and a)
        tune.stop(signal.SIGKILL)
        assert node.allocation() == held
        assert_valid(node)


def test_token_protected_agent(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    port = free_port()
    agent = start_agent_with(
        "--backend", "sim", "--listen", f"127.0.0.1:{port}", "--token-file", str(token)
    )
    try:
        refused = run_tune(agent.address, "eq", "--intervals", "2")
        assert refused.returncode == 1
        assert "the agent refused" in refused.stderr
        ok = run_tune(agent.address, "eq", "--intervals", "2", "--token-file", str(token))
        assert ok.returncode == 0, ok.stderr
        assert ok.summary["intervals"] == 2
    finally:
        agent.stop()


def test_an_exposed_metrics_endpoint_is_https_with_a_token(fresh, tmp_path) -> None:
    import ssl
    import urllib.error
    import urllib.request

    from tests.certs import make_certs

    certs = make_certs(tmp_path)
    (tmp_path / "metrics-token").write_text("m3trics\n")
    config = {
        "metrics_tls": {"cert": certs["server.pem"], "key": certs["server.key"]},
        "metrics_token_file": str(tmp_path / "metrics-token"),
        "realtime": True,
    }
    tune = start_tune(
        fresh.address, "eq", "--interval", "0.05", "--metrics-listen", "0.0.0.0:0",
        config=config,
    )  # fmt: skip
    try:
        assert tune.metrics_url.startswith("https://"), tune.stdout
        url = "https://127.0.0.1:" + tune.metrics_url.rsplit(":", 1)[1]
        context = ssl.create_default_context(cafile=certs["ca.pem"])

        def scrape(token: str | None) -> str:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=5, context=context) as resp:
                return resp.read().decode()

        assert "rdtune_tuner_intervals_total" in scrape("m3trics")
        for token in (None, "wrong"):
            with pytest.raises(urllib.error.HTTPError) as err:
                scrape(token)
            assert err.value.code == 401
    finally:
        tune.stop()


@pytest.mark.parametrize(
    ("group", "code", "needle"),
    [
        ({"cgroup": "/nonexistent/cg"}, 2, "cannot read /nonexistent/cg/cgroup.procs"),
        ({"cpus": [4000]}, 1, "the agent refused"),  # a CPU the node does not have
    ],
    ids=["cgroup", "cpus"],
)
def test_a_start_refused_for_a_group_setting_leaves_no_group_behind(
    fresh, tune_here, group, code, needle
) -> None:
    config = {"groups": [{"name": "web", **group}]}
    run = tune_here(fresh.address, "eq", "--intervals", "2", config=config)
    assert run.returncode == code and needle in run.stderr, run.stderr
    with fresh.node() as node:
        assert "web" not in node.groups()


@pytest.mark.parametrize("fallback", [None, "ubik[slack=0]", "eq"])
def test_the_fallback_is_one_whose_plans_the_node_takes(fresh, tune_here, fallback) -> None:
    """With an exclusive group, Ubik's plans share its ways and the node refuses them: the
    default fallback passes on to eq at start, and a named one is refused at start. Before,
    the fallback was found out when the SLO guard tripped, every plan of it dropped."""
    config = {"groups": [{"name": "tier", "kind": "batch", "exclusive": True}]}
    if fallback:
        config["fallback"] = fallback
    run = tune_here(fresh.address, "eq", "--intervals", "2", config=config)
    if fallback == "ubik[slack=0]":
        assert run.returncode == 2, run.stderr
        assert "the fallback controller ubik cannot control this node: group(s) tier" in (
            run.stderr
        )
        return
    assert run.returncode == 0, run.stderr
    assert "(fallback eq)" in run.stderr
