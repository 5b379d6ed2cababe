"""Suite-wide set-up for running in parallel: one local Ray shared by the tests that need a
running Ray, and the tests of one costly shared fixture kept in one process; hypothesis's
examples run without a deadline.

``make test`` runs the suite on every core with pytest-xdist (``--dist loadgroup``): each
worker process takes tests one at a time, except those of an ``xdist_group``, which go to
one worker together. Starting Ray costs ~10 s of wall time and more of CPU, so the tests
that only *use* a Ray (training sweeps, rollout workers) share one per process and are
marked ``xdist_group("ray")``. Session-scoped fixtures that train or record something
(SHARED_FIXTURES) are built once per process; their tests are grouped here so that only
one worker builds each. SB3's stray log directories go to pytest's temp directory.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings

# Speed is measured by the benchmarks (eval/bench), never asserted by a test: no per-example
# deadline, whose default (200 ms) a loaded host exceeds with a test that is otherwise fine.
settings.register_profile("rdtune", deadline=None)
settings.load_profile("rdtune")

# Fixtures any test may use, registered once (one cache per session, not per module).
pytest_plugins = ("tests.training.tiny_runs",)

# fixture -> the xdist group of every test that uses it (fixtures built on one another share
# a group). Tests already in a group keep theirs.
SHARED_FIXTURES = {
    "explore_trace": "explore_trace",  # tests/training/conftest.py: a 90 s recorded trace
    "dynamics": "explore_trace",  # ... and the dynamics fitted to it
    "heldout_trace": "explore_trace",  # ... and another recording, held out beside it
    "tiny_run": "tiny_runs",  # tests/training/tiny_runs.py: trained tiny policies
    "tiny_ppo_run": "tiny_runs",
    "tiny_export": "tiny_runs",
    "wheel": "wheel",  # tests/test_packaging.py: the wheel built from a clean checkout
}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """Group the tests of SHARED_FIXTURES before xdist reads the groups, then make sure
    each grouped test's nodeid names its group.

    xdist (3.8) tells its scheduler a test's group by appending ``@GROUP`` to the test's
    ``_nodeid``; pytest 9.2 derives ``nodeid`` from the structured ``_id``, so the suffix is
    lost and grouped tests would spread over the workers. Append it to ``_id`` instead
    (nothing to do once xdist does so itself).
    """
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        used = getattr(item, "fixturenames", ())
        group = next((g for f, g in SHARED_FIXTURES.items() if f in used), None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    result = yield  # every other plugin's hook, xdist's included
    if config.getoption("loadgroup", default=False):  # set in xdist workers of loadgroup
        from _pytest.nodeid import NodeId

        for item in items:
            marks = item.iter_markers("xdist_group")
            names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in marks})  # fmt: skip
            if names and "@" not in item.nodeid and isinstance(getattr(item, "_id", None), NodeId):
                item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")
    return result


# Ray's own pool on a 2-core machine: rollout workers and sweep trials need 2 CPUs.
RAY_CPUS = 2


@pytest.fixture(scope="session")
def _ray_down_at_exit() -> Iterator[None]:
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _uses_ray(item: pytest.Item | None) -> bool:
    return item is not None and "ray_local" in getattr(item, "fixturenames", ())


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut the shared Ray down after the last of a run of tests using it: idle, its
    processes still take ~5% of a core for the rest of the session."""
    if _uses_ray(item) and not _uses_ray(nextitem):
        import ray

        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture
def ray_local(_ray_down_at_exit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A private local Ray (``envs.cluster.start_ray("local")``, RAY_CPUS CPUs), started by
    the first test that asks for it and left running for the next ones (each worker takes a
    group's tests one after another); shut down after the last of them. A test that needs
    *no* Ray running shuts it down itself: the next user starts it again."""
    import ray

    from envs.cluster import start_ray

    if not ray.is_initialized():
        # "local" must start a private Ray even where one is advertised (a stray cluster on
        # a CI host: with no address ray.init would try to join it)
        with monkeypatch.context() as env:
            env.setenv("RAY_ADDRESS", "127.0.0.1:1")
            start_ray("local", num_cpus=RAY_CPUS)
    assert ray.is_initialized()


@pytest.fixture(scope="session", autouse=True)
def _sb3_logs_under_pytest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests that make an SB3 model themselves and call ``learn()`` would each leave an empty
    ``SB3-<time>`` directory in the system's temp directory; ``SB3_LOGDIR`` puts them in
    pytest's own (rdtune's models get a logger that writes nowhere: training/train.py)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3")))
        yield


@pytest.fixture
def http_peer() -> Iterator[str]:
    """The address of an HTTP/1 server (what the agent's metrics port is) on loopback,
    answering anything with an error: a peer that is not the agent."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
