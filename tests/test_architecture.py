"""The package layout docs/ARCHITECTURE.md describes: dependencies point down (tuner, eval,
training -> envs -> models -> agent -> proto) and no module imports itself round a cycle.
Every import counts, those inside functions too: they are dependencies all the same."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

# One worker parses the project once for all three tests (see _tree).
pytestmark = pytest.mark.xdist_group("architecture")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proto", "agent", "models", "envs", "eval", "training", "tuner")
# What each package may import from the others (the layers below it; the top layer's
# packages may also use one another).
ALLOWED = {
    "proto": set(),
    "agent": {"proto"},
    "models": {"agent", "proto"},
    "envs": {"models", "agent", "proto"},
    "eval": {"training", "tuner", "envs", "models", "agent", "proto"},
    "training": {"eval", "tuner", "envs", "models", "agent", "proto"},
    "tuner": {"eval", "training", "envs", "models", "agent", "proto"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue  # generated
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(filter(None, (_resolve(a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                target = _resolve(f"{node.module}.{a.name}") or _resolve(node.module)
                if target:
                    found.add(target)
    return found


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports; built when a test first asks (not at import,
    which every test process would pay for while collecting)."""
    return {name: _imports(path) - {name} for name, path in MODULES.items()}


def test_dependencies_point_down() -> None:
    wrong = [
        f"{m} imports {t}"
        for m, targets in graph().items()
        for t in targets
        if (a := m.split(".")[0]) != (b := t.split(".")[0]) and b not in ALLOWED[a]
    ]
    assert not wrong, wrong


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components of the module graph: all of size one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph()[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph():
        if v not in index:
            visit(v)
    assert not cycles, cycles


# Classes over 300 lines and functions over 60, each with the reason it stays whole. A new
# one fails the test below until it is split or its reason is written here.
MAX_CLASS, MAX_FUNCTION = 300, 60
LONG = {
    # -- classes
    "agent/sim/node.py:SimNode": "the Node contract over one row of the batched engine "
    "(agent/sim/engine.py): groups, tasks, monitoring and ground truth; next to split",
    "agent/sim/model.py:Model": "the simulator's equations over arrays (docs/SIMULATOR.md)",
    "agent/sim/engine.py:Engine": "N nodes' state as arrays and the step over them: one "
    "array layout shared by every part of the batched hot path (docs/BENCHMARKS.md)",
    "envs/vector_env.py:PartitionVectorEnv": "Gymnasium's VectorEnv contract (reset, step, "
    "autoreset, seeding) over one SimBatch, its per-env bookkeeping in the same arrays",
    "models/ubik.py:Ubik": "one controller whose rules follow the paper's sections in order "
    "(module docstring); the LC sizing and the batch Lookahead share its per-interval state",
    "agent/pmc/counters.py:GroupCounters": "one perf_event group's life cycle (open per CPU, "
    "read, scale, close) kept together so no file descriptor can leak between parts",
    # -- functions: command lines and documents read as one script, top to bottom
    "eval/cli.py:run": "a command's script",
    "eval/demo.py:run": "a command's script",
    "tuner/tune.py:run": "a command's script",
    "tuner/status.py:run": "a command's script",
    "agent/server/cli.py:add_arguments": "the agent's options, one declaration each",
    "training/trace_cli.py:add_arguments": "the trace commands' options, one declaration each",
    "eval/cli.py:add_arguments": "the eval command's options, one declaration each",
    "tuner/tune.py:add_arguments": "the tuner's options, one declaration each",
    "agent/server/cli.py:run": "a command's script",
    "training/trace_compare.py:compare": "an experiment's script: record, train twice, evaluate",
    "eval/report.py:write_report": "a document, section after section",
    "eval/report.py:plot_tail_vs_ways": "one figure, one matplotlib call after another",
    "eval/results.py:render": "a document, section after section",
    "eval/results.py:_suite_section": "a document section, paragraph after paragraph",
    "tuner/metrics.py:__init__": "declares every metric family in one place (Prometheus idiom)",
    "agent/server/metrics.py:collect": "every metric family of a scrape, built in one pass",
    "training/train.py:train": "CleanRL-style numbered steps read top to bottom (module docstring)",
    "training/sweep.py:run_sweep": "Ray Tune's set-up, run and summary in order",
    "training/trace_record.py:record": "the recording loop with its bookkeeping in one place",
    "eval/runner.py:run_job": "one evaluation job's pipeline: node, controller, run, metrics, "
    "timeline",
    "eval/bench/env.py:_components": "a benchmark's measured components side by side",
    "agent/describe.py:describe": "one report of a node's capabilities, line after line",
    # -- algorithms kept whole as their papers or formats give them
    "models/ubik.py:calibrate": "Ubik's profile sweep, step by step",
    "models/coco.py:calibrate": "CoCo's sensitivity profile, step by step",
    "models/search.py:search": "the bounded exhaustive search with its local refinement",
    "models/oracle.py:safe_search": "the oracle's feasibility pass and search in order",
    "agent/resctrl/discovery.py:discover": "every resctrl info file in the kernel's order",
    "agent/validate.py:_validate_one": "one group's kernel rules in the kernel's order",
    "agent/sim/catalog.py:_workload": "one workload's YAML keys, each checked",
    "agent/sim/mixes.py:random_scenario": "the scenario generator's draws in order (seeded: "
    "reordering would change every mix)",
    "training/dynamics.py:fit_dynamics": "one fit per target, in the model's order",
    "training/dynamics.py:_series": "the trace's columns as arrays, one after another",
    "training/dynamics.py:predict": "the fitted model's terms, in the documented order",
    # -- hot paths inlined on purpose (figures in docs/BENCHMARKS.md)
    "agent/sim/model.py:__init__": "the model's parameter arrays, one per catalog field",
    "agent/sim/engine.py:__init__": "the batch's state arrays, one per quantity",
    "agent/sim/batch.py:_setup": "every node's scenario into the batch's arrays, in order",
    "models/features_kernel.py:encode": "the encoder's hot path: every feature of a node, "
    "one block after another in the layout's order, compiled as one loop",
    "envs/vector_env.py:__init__": "the vector env's spaces and batch, one declaration each",
    "envs/vector_env.py:step": "decode, apply, advance, observe, reward and autoreset of N "
    "envs in one pass",
    "envs/vector.py:_sb3_class": "SB3's VecEnv methods on one adapter class built lazily "
    "(SB3 is imported only when it is used)",
    "training/rollouts.py:_class": "the Ray actor and the VecEnv that drives it, built "
    "lazily (Ray is imported only when it is used)",
    "training/train.py:make_eval_callback": "SB3's EvalCallback contract with checkpoint "
    "selection on the validation split, in one closure",
    "training/train.py:make_throughput_callback": "the throughput log's SB3 hooks (rollout "
    "start and end, update) sharing their timers",
    "agent/sim/kernel.py:_advance_node": "the simulator's hot path: one node's bracketed solve, "
    "compiled as one loop",
    "agent/sim/kernel.py:_step_occupancy": "the simulator's hot path: the exact per-way "
    "step and the caps that follow it, compiled as one loop",
    "agent/sim/truth.py:truths": "the steady-state solve, one pass",
}


def _long() -> dict[str, int]:
    out = {}
    for path in MODULES.values():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                limit = MAX_CLASS
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                limit = MAX_FUNCTION
            else:
                continue
            size = node.end_lineno - node.lineno + 1
            if size > limit:
                out[f"{rel}:{node.name}"] = size
    return out


def test_long_classes_and_functions_have_a_reason() -> None:
    long = _long()
    unexplained = {k: v for k, v in long.items() if k not in LONG}
    assert not unexplained, f"split these, or write why they stay whole: {unexplained}"
    stale = sorted(set(LONG) - set(long))
    assert not stale, f"no longer long (remove from LONG): {stale}"
