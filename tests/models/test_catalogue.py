"""The controller catalogue: specs, construction for a node (calibration on a copy), what a
node must offer; the CoPart variants and UCP-style keep to their single resource; every
built controller emits plans the node accepts."""

from __future__ import annotations

import re

import pytest

from agent.node import Node, StepByParts
from agent.sim import SimNode
from agent.types import GroupKind, Snapshot
from models import catalogue
from models.cadence import WAIT, Every, merge_snapshots
from models.catalogue import ControllerSpec, split_specs
from models.controller import KEEP, Controller, drive
from models.setup import ControllerError, Need, Setup, Unavailable


def build(spec, node, clock=None, interval_s: float = 0.1, **kw) -> Controller:
    return catalogue.build(spec, Setup(node, clock, interval_s, **kw))


def needs_bare_node(spec: ControllerSpec) -> bool:
    return spec.entry.own_groups


def test_spec_parsing() -> None:
    s = ControllerSpec.parse("ubik[slack=0.01, period=5]")
    assert (s.name, dict(s.options), s.label) == (
        "ubik",
        {"slack": 0.01, "period": 5},
        "ubik[slack=0.01, period=5]",
    )
    assert [x.name for x in split_specs("eq, static[ways=3],ubik[slack=0,period=2]")] == [
        "eq",
        "static",
        "ubik",
    ]
    assert ControllerSpec("static", {"ways": 4}).text == "static[ways=4]"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nope", "unknown controller 'nope'"),
        ("ubik[slack]", "bad option"),
        ("ubik[slack=1", "bad controller spec"),
        ("eq[", "bad controller spec 'eq\\['"),
        ("eq[seed={]", "bad value for option 'seed' in 'eq\\[seed={]': expected the node"),
        ("ubik[slack=abc]", "option 'slack' must be a number, got 'abc' \\(str\\)"),
        ("explore[seed=true]", "option 'seed' must be an integer, got True \\(bool\\)"),
        ("static[lc_group=3]", "option 'lc_group' must be a string or none, got 3 \\(int\\)"),
    ],
)
def test_bad_specs_are_clear_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ControllerSpec.parse(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("import:os:sep", "os.sep is a str, not a controller class"),
        ("import:os:nope", "has no attribute 'nope'"),
        ("import:os", "use import:MODULE:CLASS"),
    ],
)
def test_an_import_that_is_no_controller_is_a_clear_error(text: str, match: str) -> None:
    from models.catalogue import ControllerError

    with pytest.raises(ControllerError, match=match):
        ControllerSpec.parse(text).entry.takes()


@pytest.mark.parametrize("build_it", ["build", "construct"])
def test_options_given_apart_from_the_spec_are_type_checked(build_it: str) -> None:
    # a configuration's controller_options reach the controller without a spec string
    spec = ControllerSpec.parse("ubik").with_options({"slack": "abc"})
    node = SimNode("default", 0)
    with pytest.raises(ValueError, match="controller 'ubik': option 'slack' must be a number"):
        if build_it == "build":
            build(spec, node, node)
        else:
            catalogue.construct(spec)


def test_unknown_option_is_a_clear_error() -> None:
    node = SimNode("default", 0)
    with pytest.raises(ValueError, match="bad options for controller 'eq\\[foo=1\\]'"):
        build("eq[foo=1]", node, node)


@pytest.mark.parametrize(
    "text",
    [
        "unpartitioned",
        "eq",
        "copart",
        "copart_cat",
        "copart_mba",
        "static",
        "static[ways=3]",
        "ubik[slack=0.01]",
        "static_lc",
        "ucp",
    ],
)
def test_built_controllers_drive_a_node(text: str) -> None:
    node = SimNode("default", 1)
    before = node.now()
    ctl = build(text, node, node)
    assert node.now() == before  # calibration ran on a copy, not on the run's node
    records = drive(ctl, node, node, 40, 0.1)
    assert len(records) == 40
    caps = node.capabilities()
    for r in records:
        for g in r.allocation:
            a = r.allocation[g][0]
            assert a.l3_mask and a.l3_mask & ~caps.l3.cbm_mask == 0


def test_static_protects_the_lc_group_from_the_sweep() -> None:
    node = SimNode("default", 1)
    ctl = build("static", node, node)
    lc = [g for g, s in node.groups().items() if s.kind is GroupKind.LC]
    assert ctl.lc_group == lc[0] and 1 <= ctl.ways < node.capabilities().l3.num_ways


def test_copart_cat_only_keeps_the_equal_bandwidth_split() -> None:
    # The paper's CAT-only: dynamic LLC partitioning, equal memory bandwidth partitioning.
    node = SimNode("copart_h_bw", 0)
    top = node.capabilities().mba.max_bandwidth
    records = drive(build("copart_cat", node, node), node, node, 160, 0.1)
    late = records[80:]  # after profiling (4 apps x 3 runs x 6 intervals)
    mbs = {tuple(sorted(r.allocation[g][0].mb for g in r.allocation)) for r in late}
    assert len(mbs) == 1 and max(next(iter(mbs))) < top  # held, and throttled to the split
    ways = {
        tuple(sorted(bin(r.allocation[g][0].l3_mask).count("1") for g in r.allocation))
        for r in late
    }
    assert len(ways) > 1  # ways were traded


def test_copart_mba_only_keeps_the_equal_way_split() -> None:
    node = SimNode("copart_h_bw", 0)
    records = drive(build("copart_mba", node, node), node, node, 160, 0.1)
    late = records[80:]  # after profiling (4 apps x 3 runs x 6 intervals)
    ways = {
        tuple(sorted(bin(r.allocation[g][0].l3_mask).count("1") for g in r.allocation))
        for r in late
    }
    assert len(ways) == 1
    mbs = {r.allocation[g][0].mb for r in late for g in r.allocation}
    assert len(mbs) > 1  # bandwidth was traded


@pytest.mark.parametrize(
    ("text", "option"),
    [
        ("static[ways=30]", "ways"),  # the node has 11: it failed at start
        ("static[ways=0]", "ways"),
        ("static[slack=-5]", "slack"),  # after the whole sweep had run
        ("static[tolerance=-1]", "tolerance"),
        ("copart[lc_ways=-1]", "lc_ways"),
        ("copart[lc_ways=0]", "lc_ways"),  # read as "not given" before
        ("copart[theta=-1]", "theta"),
        ("copart[confirm=0]", "confirm"),
        ("copart[shrink_after=-1]", "shrink_after"),
        ("copart[grow_at=0.2,shrink_at=0.9]", "shrink_at < grow_at"),
        ("ubik[idle_fraction=2]", "idle_fraction"),  # a loaded service pinned as idle
        ("ubik[gain=-1]", "gain"),  # the feedback turned around
        ("ubik[sigma_max=-1]", "sigma_max"),
        ("ubik[probe_every=-5]", "probe_every"),
        ("ubik[miss_penalty_cycles=-200]", "miss_penalty_cycles"),
        ("best_static[max_evals=0]", "max_evals"),
    ],
)
def test_an_option_value_out_of_range_is_refused_as_the_controller_is_built(
    text: str, option: str
) -> None:
    """Accepted before, these ran wrong or failed once a decision needed them."""
    node = SimNode("default", 0)  # memcached and batch jobs on a Gold 6130 (11 ways)
    with pytest.raises(ControllerError, match=f"controller {re.escape(repr(text))}: ") as err:
        build(text, node, node)
    assert option in str(err.value)


def test_copart_mba_is_unavailable_on_a_node_without_mba() -> None:
    """It trades bandwidth only: without MBA it ran as EQ's way split under its name."""
    node = SimNode("more_lc_than_closids_e5v3", 0)
    assert node.capabilities().mba is None
    with pytest.raises(Unavailable, match="this node has no MBA"):
        build("copart_mba", node, node)


def test_ucp_moves_ways_by_utility() -> None:
    node = SimNode("copart_h_llc", 0)
    records = drive(build("ucp", node, node), node, node, 60, 0.1)
    counts = [
        sorted(bin(r.allocation[g][0].l3_mask).count("1") for g in r.allocation) for r in records
    ]
    assert counts[-1] != counts[0]  # Lookahead left the equal split
    assert all(sum(c) == node.capabilities().l3.num_ways for c in counts)


def test_time_sharing_needs_a_bare_node() -> None:
    spec = ControllerSpec.parse("coco")
    assert needs_bare_node(spec) and not needs_bare_node(ControllerSpec.parse("eq"))
    node = SimNode("more_lc_than_closids_epyc", 0)
    with pytest.raises(ValueError, match="without per-workload groups"):
        build(spec, node, node)


@pytest.mark.parametrize("name", ["coco", "round_robin"])
def test_time_sharing_plans_for_the_slos_the_run_is_judged_by(name: str) -> None:
    """lc_batch_60 sets xapian's SLO target to 8 ms (its catalog's is 5 ms): the services
    a time-sharing controller schedules carry the scenario's targets, as eval's per-service
    judge reads them (WorkloadView.slo)."""
    node = SimNode("lc_batch_60", 0, auto_groups=False)
    ctl = build(ControllerSpec.parse(name), node, node)
    slos = {s.name: s.slo.target_ms for s in getattr(ctl, "inner", ctl).services}
    assert slos == {w.name: w.slo.target_ms for w in node.workloads() if w.kind == "lc"}
    assert slos["xapian"] == 8.0


def test_merged_snapshots_sum_counters_and_weight_latency() -> None:
    from agent.types import GroupSample, LatencyStats, Snapshot

    a = Snapshot(
        0.1,
        0.1,
        {
            "g": GroupSample(
                instructions=1e8,
                cycles=2e8,
                llc_misses=None,
                latency=LatencyStats(100, 1.0, 2.0, 3.0, 4.0),
            )
        },
    )
    b = Snapshot(
        0.2,
        0.1,
        {
            "g": GroupSample(
                instructions=3e8,
                cycles=4e8,
                llc_misses=5.0,
                latency=LatencyStats(300, 2.0, 3.0, 4.0, 5.0),
            )
        },
        vanished=frozenset({"x"}),
    )
    m = merge_snapshots([a, b])
    g = m.groups["g"]
    assert (m.timestamp, m.interval_s, m.vanished) == (0.2, pytest.approx(0.2), {"x"})
    assert (g.instructions, g.cycles, g.llc_misses) == (4e8, 6e8, None)  # None: not measured
    assert g.latency.count == 400 and g.latency.p95_ms == pytest.approx(2.75)


def test_every_decides_on_the_merge_of_the_snapshots_since_its_last_decision() -> None:
    node = SimNode("lc_bursty", 2)

    class Recording(Controller):
        """Records each snapshot, then answers as ``then`` does (KEEP without one)."""

        name = "recording"

        def __init__(self, then: Controller | None = None) -> None:
            self.seen: list[Snapshot] = []
            self.then = then

        def decide(self, snapshot, ctx):
            self.seen.append(snapshot)
            return KEEP if self.then is None else self.then.decide(snapshot, ctx)

    inner = Recording()
    outer = Recording(Every(inner, 4))
    drive(outer, node, node, 13, 0.1)
    observed = outer.seen
    # decisions after intervals 1, 5, 9 and 13 (the first after one interval), each merged
    # exactly as merge_snapshots merges the intervals since the one before
    assert inner.seen == [
        merge_snapshots(observed[i:j]) for i, j in ((0, 1), (1, 5), (5, 9), (9, 13))
    ]


def test_decide_s_slows_any_controller_down() -> None:
    node = SimNode("default", 1)
    records = drive(build("ucp[period=1,decide_s=1]", node, node, 0.1), node, node, 60, 0.1)
    changed = [i for i, r in enumerate(records) if r.decision.plan is not None]
    assert len(changed) > 1 and all(i % 10 == 0 for i in changed)  # every 10th interval

    class Counting(Controller):
        name = "counting"
        seen: list[float] = []

        def decide(self, snapshot, ctx):
            self.seen.append(snapshot.interval_s)
            return KEEP

    inner = Counting()
    records = drive(Every(inner, 10), node, node, 25, 0.1)
    # the first decision after one interval (the node as found may miss an SLO already),
    # then one per 10 intervals, each from the 10 merged
    assert inner.seen == pytest.approx([0.1, 1.0, 1.0])
    # in between, the wrapper's own answer: what eval/metrics.py leaves out of decide time
    assert [i for i, r in enumerate(records) if r.decision is not WAIT] == [0, 10, 20]
    with pytest.raises(ValueError, match="whole number"):
        build("eq[decide_s=0.25]", node, node, 0.1)


@pytest.mark.parametrize("value", ["abc", ".inf", "nan", "-1", "0"])
def test_a_decide_s_that_is_no_duration_is_refused_before_the_node(value: str) -> None:
    # before: float('abc') escaped as a bare ValueError once connected, inf as OverflowError
    from tuner import controllers

    with pytest.raises(ControllerError, match="decide_s must be a number of seconds > 0"):
        controllers.check(f"eq[decide_s={value}]")


class Opaque(StepByParts):
    """A node that offers exactly the Node contract (and a simulated clock): a real SimNode
    seen as a remote client would see it, without ground truth and not copyable."""

    def __init__(self, node: SimNode) -> None:
        self._node = node

    def __deepcopy__(self, memo):
        raise TypeError("an opaque node cannot be copied")

    def capabilities(self):
        return self._node.capabilities()

    def groups(self):
        return self._node.groups()

    def create_group(self, spec) -> None:
        self._node.create_group(spec)

    def delete_group(self, name: str) -> None:
        self._node.delete_group(name)

    def assign(self, group: str, *, pids=(), cpus=()) -> None:
        self._node.assign(group, pids=pids, cpus=cpus)

    def tasks(self, group: str):
        return self._node.tasks(group)

    def apply(self, plan, *, dry_run: bool = False):
        return self._node.apply(plan, dry_run=dry_run)

    def allocation(self):
        return self._node.allocation()

    def reserved_ways(self):
        return self._node.reserved_ways()

    def observe(self):
        return self._node.observe()

    def close(self) -> None:
        self._node.close()

    def now(self) -> float:
        return self._node.now()

    def reset(self, scenario=None, seed=None) -> None:
        self._node.reset(scenario, seed)

    def advance(self, dt: float) -> None:
        self._node.advance(dt)


# Bounds that keep the searches of a test short; the rest is each controller's default set-up.
QUICK = {
    "oracle": "oracle[max_evals=20,warm_evals=4]",
    "best_static": "best_static[max_evals=20]",
}
BARE = "more_lc_than_closids_epyc"  # time-sharing controllers make their own groups


@pytest.mark.parametrize("name", catalogue.names())
def test_every_entry_builds_for_a_simulated_node_and_drives_it(name: str) -> None:
    entry = catalogue.get(name)
    if name == "policy":
        from models.policy import policy_available

        if not policy_available():
            pytest.skip("no bundled policy in this checkout")
    node = SimNode(BARE, 0, auto_groups=False) if entry.own_groups else SimNode("default", 1)
    ctl = build(QUICK.get(name, name), node, node)
    assert isinstance(ctl, Controller)
    records = drive(ctl, node, node, 5, 0.1)
    for r in records:
        for g in r.allocation:
            a = r.allocation[g][0]
            assert a.l3_mask and a.l3_mask & ~node.capabilities().l3.cbm_mask == 0


def _with_exclusive(scenario: str, exclusive: set[str]) -> SimNode:
    """``scenario``'s node, each workload in a group of its own, those named in
    ``exclusive`` created exclusive on ways the others were moved off."""
    from agent.types import GroupSpec
    from models.allocation import plan_from

    node = SimNode(scenario, 0, auto_groups=False)
    caps = node.capabilities()
    views = sorted(node.workloads(), key=lambda w: w.name in exclusive)
    free = (1 << (2 * len(exclusive))) - 1  # two low ways for each exclusive group
    for w in views:
        if w.name in exclusive and not any(s.exclusive for s in node.groups().values()):
            others = {g: caps.l3.cbm_mask & ~free for g in node.groups()}
            node.apply(plan_from(others, {}, caps))
        kind = GroupKind.LC if w.kind == "lc" else GroupKind.BATCH
        slo = w.slo if kind is GroupKind.LC else None
        node.create_group(GroupSpec(w.name, kind, slo, exclusive=w.name in exclusive))
        node.assign(w.name, pids=list(w.pids))
    return node


EXCLUSIVE = {  # scenario, its exclusive groups
    "batch": ("lc_batch_20", {"spec_s"}),
    "lc": ("lc_batch_20", {"masstree"}),
    "both lc": ("lc_batch_20", {"masstree", "xapian"}),
}


@pytest.mark.parametrize("case", EXCLUSIVE)
@pytest.mark.parametrize("name", [n for n in catalogue.names() if not catalogue.get(n).own_groups])
def test_an_exclusive_group_is_kept_apart_or_the_controller_refused(name: str, case: str) -> None:
    """The kernel refuses a plan in which an exclusive group's ways meet another group's.
    A controller that would share them is refused as it is built, naming the groups;
    the others' plans are accepted. Before, static (the tuner's default fallback), CoPart,
    Ubik and the searches failed mid-run on an InvalidAllocation."""
    if name == "policy":
        from models.policy import policy_available

        if not policy_available():
            pytest.skip("no bundled policy in this checkout")
    scenario, exclusive = EXCLUSIVE[case]
    node = _with_exclusive(scenario, exclusive)
    assert {g for g, s in node.groups().items() if s.exclusive} == exclusive
    try:
        ctl = build(QUICK.get(name, name), node, node)
    except Unavailable as exc:
        assert "exclusive" in str(exc), exc
        return
    drive(ctl, node, node, 20, 0.1)  # an InvalidAllocation raises


def test_a_node_without_ground_truth_is_refused_naming_what_it_lacks() -> None:
    node = Opaque(SimNode("default", 1))
    assert isinstance(node, Node) and not Need.GROUND_TRUTH.offered_by(node)
    with pytest.raises(Unavailable, match=r"'oracle' cannot run .* needs ground truth.*Opaque"):
        build("oracle", node)
    with pytest.raises(Unavailable, match=r"give services=.* and groups="):
        build("coco", Opaque(SimNode(BARE, 0, auto_groups=False)))


@pytest.mark.parametrize(
    ("spec", "skip"),
    [
        ("static", "lc_group and ways"),
        ("ubik", "profiles"),
        ("static_lc", "profiles"),
        ("best_static[max_evals=5]", "result"),
    ],
)
def test_calibration_runs_on_a_node_that_cannot_be_copied_only_when_allowed(
    spec: str, skip: str
) -> None:
    node = Opaque(SimNode("default", 1))
    with pytest.raises(Unavailable, match=f"give {skip} in its options"):
        build(spec, node)
    assert node.now() == 0.0  # refused before touching the node
    setup = Setup(node, live_calibration=True)
    assert isinstance(catalogue.build(spec, setup), Controller)
    assert setup.disturbed and node.now() > 0.0


def test_calibrated_options_given_skip_calibration() -> None:
    node = Opaque(SimNode("default", 1))
    ctl = build("static[lc_group=memcached,ways=3]", node)
    assert (ctl.lc_group, ctl.ways, node.now()) == ("memcached", 3, 0.0)
    # the sweep's settings are left unused, not passed on to the controller
    ctl = build("static[lc_group=memcached,ways=3,measure_s=1]", node)
    assert (ctl.lc_group, ctl.ways, node.now()) == ("memcached", 3, 0.0)
    ubik = catalogue.build(ControllerSpec("ubik", {"profiles": {"memcached": 4}}), Setup(node))
    assert ubik.profiles["memcached"].target_ways == 4 and node.now() == 0.0


def test_calibration_runs_on_a_copy_with_another_future_than_the_run() -> None:
    """A controller calibrates on a copy of the node as it is now, drawing its noise and
    requests from other streams: the run's own would fit it to what it is judged on."""
    node = SimNode("copart_memcached", seed=3)
    with Setup(node).calibration("x") as (copy, clock):
        assert copy is not node and clock is copy and copy.now() == node.now()
        copy.advance(1.0)
        node.advance(1.0)
        seen, run = copy.observe(), node.observe()
    counts = [(s.instructions, s.latency.count if s.latency else None) for s in run.groups.values()]
    drawn = [(s.instructions, s.latency.count if s.latency else None) for s in seen.groups.values()]
    assert seen.groups.keys() == run.groups.keys() and drawn != counts


def test_training_calibrates_like_evaluation() -> None:
    """Training's held-out comparison builds through the catalogue too: static's sweep on a
    copy of the episode's node (on this scenario and seed a differently seeded twin picks
    another way count), Ubik with its profiled targets."""
    import gymnasium as gym

    import envs  # noqa: F401
    from training.evaluate import controller_factory

    env = gym.make("rdtune/Partition-v0", scenarios=["lc_batch_20"], episode_steps=4)
    env.reset(seed=2)
    node = env.unwrapped.node
    trained = controller_factory("static")(env)
    evaluated = build("static", node, node)
    assert (trained.lc_group, trained.ways) == (evaluated.lc_group, evaluated.ways)
    ubik = controller_factory("ubik")(env)
    assert set(ubik.profiles) == {g for g, s in node.groups().items() if s.kind is GroupKind.LC}
    env.close()


def test_listing_names_every_entry_with_its_options_and_needs() -> None:
    text = catalogue.describe()
    for name in catalogue.names():
        assert any(line.startswith(f"{name} ") for line in text.splitlines()), name
    assert "needs ground truth" in text
    # a sweep (what rdtune tune --calibrate allows on a live node) apart from what is read
    # off a node: copart runs on an agent without one, where the listing said it calibrated
    assert "calibrated by a sweep of the node when not given: lc_group, ways" in text
    copart = text[text.index("\ncopart ") : text.index("\ncopart_cat ")]
    assert "sweep" not in copart and "estimated from peak bandwidth" in " ".join(copart.split())
    assert "calibration options: load, set_load, measure_s, warmup_s" in text


@pytest.mark.parametrize(
    ("text", "name", "options"),
    [
        ("policy:/x/y", "policy", {"path": "/x/y"}),
        ("import:tests.tuner.controllers:Quiet", "import:tests.tuner.controllers:Quiet", {}),
    ],
)
def test_policy_and_import_specs(text: str, name: str, options: dict) -> None:
    spec = ControllerSpec.parse(text)
    assert (spec.name, dict(spec.options), spec.label) == (name, options, text)
