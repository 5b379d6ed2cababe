"""Benchmark of the learned-policy runtime: per-decision cost of the shipped exported
policy (models/policies/default) with ONNX Runtime, batch 1, one intra-op thread (target
p99 <= 200 us), and compiled as the runtime runs it (models/actor.py), and of a whole
``PolicyController.decide()`` (feature encoding + inference + action decoding into a plan,
and the SLO shield's update when the policy runs behind it), on snapshots of the default
simulated scenario: once on the same snapshot repeated (what the runtime costs when nothing
changes), once along a run where every decision sees a new snapshot and the allocation it
chose (what evaluation and the tuner pay, and what the decision-latency target is judged
on)."""

from __future__ import annotations

from eval.bench.harness import Result, latencies, latency_result


def run(quick: bool) -> list[Result]:
    from agent.sim import SimNode
    from models.controller import carry_out, context
    from models.policy import DEFAULT_POLICY, PolicyController

    n = 2_000 if quick else 20_000
    ctrl = PolicyController.load(DEFAULT_POLICY)
    node = SimNode("default", seed=1)
    carry_out(node, ctrl.start(context(node)))
    node.observe()
    node.advance(1.0)
    snap = node.observe()
    ctx = context(node)
    slots = ctrl.encoder.slots(ctx.groups)
    obs = ctrl.encoder.encode(snap, ctx.allocation, ctx.groups, ctx.capabilities, slots)
    mask = ctrl.decoder.action_mask(len(slots), ctx.capabilities)
    feeds = {"obs": obs[None, :]}
    if ctrl.masked:
        feeds["action_mask"] = mask[None, :]
    session = ctrl._session
    results = [
        latency_result(
            "policy: ONNX Runtime session.run, batch 1, 1 thread",
            latencies(lambda: session.run(None, feeds), n),
            target="p99 <= 200 us",
        ),
        latency_result(
            "policy: act() through ONNX Runtime (normalise + run + argmax out)",
            latencies(lambda: ctrl._act_onnx(obs, mask), n),
            target="p99 <= 200 us",
        ),
        latency_result(
            f"policy: act() as the runtime runs it ({ctrl.runtime}; models/actor.py)",
            latencies(lambda: ctrl.act(obs, mask), n),
            target="p99 <= 200 us",
        ),
        latency_result(
            "policy: encode snapshot (FeatureEncoder)",
            latencies(
                lambda: ctrl.encoder.encode(
                    snap, ctx.allocation, ctx.groups, ctx.capabilities, slots
                ),
                n,
            ),
        ),
        latency_result(
            f"policy: full decide() ({len(slots)} groups, {ctx.capabilities.description})",
            latencies(lambda: ctrl.decide(snap, ctx), n),
        ),
    ]
    node.close()
    results.append(_along_a_run(ctrl, n // 10))
    return results


def _along_a_run(ctrl, decisions: int) -> Result:
    """decide() on the default scenario's run, one decision a second, each on a new
    snapshot and the allocation the last one chose."""
    from agent.sim import SimNode
    from models.controller import drive

    run = SimNode("default", seed=2)
    along = [r.decide_s for r in drive(ctrl, run, run, decisions, interval_s=1.0)]
    run.close()
    return latency_result(
        f"policy: decide() along a run ({decisions} decisions a second apart, new snapshots)",
        along,
        target="p50 <= 100 us",
    )
