"""Runtime-managed RDT classes (deploy/kubernetes/runtime-classes.yaml, rdt-config.yaml):
the container runtime creates the classes and puts annotated pods in them; the agent adopts
the classes its config names and the tuner splits the cache among them, on the FUSE
emulator behaving like the kernel. Nothing of rdtune's own is created, nothing the runtime
made is removed, a class the agent was not given is left alone."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest
import yaml

from agent.errors import GroupNotFound, Unsupported
from agent.types import GroupSpec
from tests.tuner.conftest import ROOT, assert_valid, start_agent_with, start_tune, wait_for
from tuner.status import read_metrics

K8S = ROOT / "deploy" / "kubernetes"
ANNOTATION = "rdt.resources.beta.kubernetes.io/pod"


def recipe() -> tuple[dict, dict, list[str], str]:
    """The recipe's agent and tuner configs, the runtime's classes, the example pod's class."""
    docs = {d["kind"]: d for d in yaml.safe_load_all((K8S / "runtime-classes.yaml").read_text())}
    data = docs["ConfigMap"]["data"]
    rdt = yaml.safe_load((K8S / "rdt-config.yaml").read_text())
    classes = list(rdt["partitions"]["default"]["classes"])
    pod_class = docs["Deployment"]["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    agent, tuner = yaml.safe_load(data["agent.yaml"]), yaml.safe_load(data["tuner.yaml"])
    return agent, tuner, classes, pod_class


def test_the_recipe_names_the_same_classes_everywhere() -> None:
    agent, tuner, classes, pod_class = recipe()
    assert agent["runtime_classes"] == classes
    assert [g["name"] for g in tuner["groups"]] == classes
    assert pod_class in classes


@pytest.fixture
def emu():
    pytest.importorskip("agent.resctrl", reason="ResctrlNode not available")
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("intel-20way") as mounted:
        yield mounted


@pytest.fixture
def pod():
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_the_tuner_adopts_the_classes_the_runtime_created(emu, pod, tmp_path) -> None:
    agent_cfg, tuner_cfg, classes, pod_class = recipe()
    # the container runtime: its classes (and one rdtune is not given), a pod in its class
    for name in (*classes, "bronze"):
        os.mkdir(os.path.join(emu.root, name))
    emu.write(f"{pod_class}/tasks", str(pod))
    untouched = emu.read("bronze/schemata")
    full = {name: emu.read(f"{name}/schemata") for name in classes}

    sock = os.path.join(tempfile.mkdtemp(prefix="rdt"), "a.sock")
    here = {"root": emu.root, "state_dir": emu.state_dir, "listen": f"unix:{sock}",
            "health_listen": "", "metrics_listen": ""}  # fmt: skip
    agent_yaml = tmp_path / "agent.yaml"
    agent_yaml.write_text(yaml.safe_dump(
        {k: v for k, v in agent_cfg.items() if not k.startswith("metrics_")} | here
    ))  # fmt: skip
    agent = start_agent_with("--config", str(agent_yaml))
    tuner = {k: v for k, v in tuner_cfg.items() if not k.startswith("metrics_")}
    tuner |= {"realtime": True, "resync_intervals": 2, "agent": {"address": agent.address}}
    tune = start_tune(agent.address, "eq", "--interval", "0.05", "--metrics-listen",
                      "127.0.0.1:0", config=tuner)  # fmt: skip
    try:
        wait_for(lambda: read_metrics(tune.metrics_url)["rdtune_tuner_intervals_total"][0][1] >= 5)
        with agent.node() as node:
            assert set(node.groups()) == set(classes)
            held = assert_valid(node)
            assert node.tasks(pod_class) == frozenset([pod]), "the runtime placed the pod"
            domain = node.capabilities().domains[0]
        for name in classes:
            (l3,) = [ln for ln in emu.read(f"{name}/schemata").split() if ln.startswith("L3:")]
            written = dict(part.split("=") for part in l3.removeprefix("L3:").split(";"))
            # the tuner's allocation, in the runtime's directory
            assert int(written[str(domain)], 16) == held.get(name, domain).l3_mask
        assert any(emu.read(f"{n}/schemata") != full[n] for n in classes), "nothing was split"
        assert not [d for d in os.listdir(emu.root) if d.startswith("rdtune-")]
        assert emu.read("bronze/schemata") == untouched
    finally:
        tune.stop()
        agent.stop()
    for name in classes:
        assert os.path.isdir(os.path.join(emu.root, name)), "the runtime's class stays"


def test_adoption_needs_the_class_and_deleting_only_forgets_it(emu) -> None:
    from agent.resctrl import ResctrlNode

    node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None, runtime_classes=["gold"])
    try:
        with pytest.raises(Unsupported, match="runtime class 'gold' does not exist"):
            node.create_group(GroupSpec("gold"))
        os.mkdir(os.path.join(emu.root, "gold"))
        node.create_group(GroupSpec("gold"))
        assert set(node.groups()) == {"gold"}
        node.delete_group("gold")
        assert os.path.isdir(os.path.join(emu.root, "gold")) and not node.groups()
        with pytest.raises(GroupNotFound):
            node.tasks("gold")
        node.create_group(GroupSpec("gold"))
    finally:
        node.close()
    # a restarted agent adopts it again from its record
    again = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None, runtime_classes=["gold"])
    try:
        assert set(again.groups()) == {"gold"} and not again.not_ours
    finally:
        again.close()
