"""The compiled forward pass of exported policies (models/actor.py): the runtime uses it
for the default design, where it decides what ONNX Runtime and the trained torch policy
decide, and keeps ONNX Runtime for any other network and for any graph it misreads."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from agent.sim import SimNode
from models.actor import (
    NonFiniteLogits,
    check_logits,
    compile_actor,
    disagreements,
    probes,
    read_model,
    with_logits,
)
from models.controller import drive
from models.features import group_features
from models.policy import DEFAULT_POLICY, PolicyController
from tests.models.exports import copy_export

pytest.importorskip("numba")


def _probes(ctrl: PolicyController, n: int, seed: int):
    names = group_features(ctrl.encoder.version)
    size, groups = ctrl.encoder.size, ctrl.encoder.max_groups
    masks = int(ctrl.decoder.nvec.sum())
    return probes(size, groups, len(names), names.index("present"), masks, n=n, seed=seed)


def test_the_shipped_policy_runs_compiled_as_onnx_runtime_decides() -> None:
    fast = PolicyController(DEFAULT_POLICY)
    reference = PolicyController(DEFAULT_POLICY, compiled=False)
    assert (fast.runtime, reference.runtime) == ("compiled", "onnxruntime")
    cases = _probes(fast, 500, seed=1)
    # The two best open logits of each of these probes differ by 2e-3 or more (measured
    # in float64), far beyond float32 rounding: the argmaxes must be equal on any CPU.
    assert disagreements(fast.act, reference.act, cases) == 0
    actions = {tuple(fast.act(o, m)) for o, m in cases[:100]}
    assert len(actions) > 50  # the probes reach many decisions, not one


def test_the_shipped_policy_drives_a_node_as_under_onnx_runtime() -> None:
    plans = []
    for compiled in (True, False):
        node = SimNode("lc_batch_60", seed=4)  # where the policy changes its allocation
        ctrl = PolicyController(DEFAULT_POLICY, compiled=compiled)
        plans.append([r.allocation for r in drive(ctrl, node, node, 40, interval_s=1.0)])
        node.close()
    assert plans[0] == plans[1]
    assert len({str(a) for a in plans[0]}) > 1  # the allocation moved during the run


def test_a_slot_policy_trained_here_runs_compiled_as_sb3_decides(tiny_ppo_run, tmp_path):
    import shutil

    import gymnasium as gym
    import torch

    import envs  # noqa: F401
    from training.export import export_run
    from training.rundir import save_checkpoint
    from training.train import load_model

    # A tiny run may have learnt one action for every observation, which any forward pass
    # that ignores the observation matches: its action head is drawn again at random.
    run = tmp_path / "run"
    shutil.copytree(tiny_ppo_run.run_dir, run)
    model = load_model(run / "best_model.zip", "PPO")
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.policy.action_net.parameters():
            p.copy_(torch.randn_like(p))
    save_checkpoint(model, run / "best_model.zip")
    export_run(run, tmp_path / "export", parity_observations=16)
    ctrl = PolicyController(tmp_path / "export")
    assert ctrl.runtime == "compiled"
    env = gym.make(ctrl.card.env["id"], **ctrl.card.env["kwargs"])
    obs, _ = env.reset(seed=5)
    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(40):
        want, _ = model.predict(obs, deterministic=True)
        got = ctrl.act(obs)
        np.testing.assert_array_equal(got, want)
        seen.add(tuple(got))
        obs, _, _, trunc, _ = env.step(env.action_space.sample() if rng.random() < 0.5 else want)
        if trunc:
            obs, _ = env.reset(seed=int(rng.integers(1000)))
    env.close()
    assert len(seen) > 1


def test_other_networks_keep_onnx_runtime(tiny_export) -> None:
    """The tiny export has an actor MLP and a flat action head: not the design."""
    ctrl = PolicyController(tiny_export)
    assert ctrl.runtime == "onnxruntime"
    names = group_features(ctrl.encoder.version)
    data = (tiny_export / "policy.onnx").read_bytes()
    dec = ctrl.decoder
    assert (
        compile_actor(
            data,
            groups=dec.max_groups,
            features=len(names),
            present_at=names.index("present"),
            share_levels=dec.share_levels,
            mba_levels=dec.mba_levels,
        )
        is None
    )
    assert compile_actor(b"not onnx", groups=8, features=24, present_at=0, share_levels=5,
                         mba_levels=4) is None  # fmt: skip


def test_a_graph_the_compiled_pass_misreads_keeps_onnx_runtime(tmp_path, caplog) -> None:
    """Layers and shapes as the design's, but a slot counts as present above 1.5 (the
    design: 0.5): the probes at load see it, and the runtime keeps ONNX Runtime."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(DEFAULT_POLICY / "policy.onnx"))
    graph = model.graph
    (greater,) = [n for n in graph.node if n.op_type == "Greater"]
    (const,) = [n for n in graph.node if n.output[0] == greater.input[1]]
    value = numpy_helper.to_array(const.attribute[0].t)
    assert value == np.float32(0.5)
    const.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(1.5, dtype=value.dtype)))
    data = model.SerializeToString()
    digest = hashlib.sha256(data).hexdigest()
    path = copy_export(DEFAULT_POLICY, tmp_path / "p", **{"runtime.onnx.sha256": digest})
    (path / "policy.onnx").write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="rdtune.policy"):
        ctrl = PolicyController(path)
    assert ctrl.runtime == "onnxruntime"
    assert "disagrees with ONNX Runtime" in caplog.text


def test_without_compiling_the_runtime_keeps_onnx_runtime() -> None:
    """Under NUMBA_DISABLE_JIT the loop would run as Python, far slower than ONNX Runtime."""
    from tests.uncompiled import run_json

    script = (
        "import json; from models.policy import DEFAULT_POLICY, PolicyController; "
        "print(json.dumps(PolicyController(DEFAULT_POLICY).runtime))"
    )
    assert run_json(script, compiled=False) == "onnxruntime"
    assert run_json(script) == "compiled"


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("part", [0, 1])  # the output layer's weights, its bias
def test_the_compiled_pass_refuses_non_finite_logits(value: float, part: int) -> None:
    ctrl = PolicyController(DEFAULT_POLICY)
    actor = ctrl._actor
    assert actor is not None
    obs, mask = _probes(ctrl, 1, seed=0)[0]
    assert actor(obs, mask, ctrl._norm).min() >= 0
    *rest, out = actor.layers
    out = tuple(np.full_like(a, value) if i == part else a for i, a in enumerate(out))
    broken = dataclasses.replace(actor, layers=(*rest, out))
    with pytest.raises(NonFiniteLogits, match="logits are not finite"):
        broken(obs, mask, ctrl._norm)


def test_onnx_runtime_returns_the_logits_its_argmaxes_read() -> None:
    model = read_model((DEFAULT_POLICY / "policy.onnx").read_bytes())
    argmaxes = sum(n.op_type == "ArgMax" for n in model.graph.node)
    outputs = read_model(with_logits(model)).graph.output
    assert argmaxes and outputs[0].name == "action"
    assert len(outputs) == 1 + argmaxes
    ctrl = PolicyController(DEFAULT_POLICY, compiled=False)
    assert len(ctrl._session.get_outputs()) == 1 + argmaxes
    with pytest.raises(NonFiniteLogits):
        check_logits(np.zeros(3), np.array([0.0, np.nan]))
