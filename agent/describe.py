"""Describe a node: its capabilities and own groups (``rdtune describe``).

Prints what a controller would see: cache ways and masks, CLOSIDs, MBA mode and range,
monitoring events, which PMC events work here, and the node's own groups with their kind,
SLO and current allocation. Works on this machine's resctrl or on an emulated one
(``rdtune emulate-resctrl``), or on a simulated server (``--backend sim``); other
backends plug in through :data:`BACKENDS`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def _resctrl(args: argparse.Namespace):
    # Read-only: the agent may be serving this node (it holds the state file's lock), and
    # a look must not recover, adopt or create anything.
    from agent.resctrl.view import ResctrlView

    return ResctrlView(args.root, args.prefix, args.state_dir)


def _sim(args: argparse.Namespace):
    from agent.sim import DEFAULT_SCENARIO, SimNode

    return SimNode(args.scenario or DEFAULT_SCENARIO)


# backend name -> factory(args) -> Node. Add a backend here to describe it.
BACKENDS: dict[str, Callable[[argparse.Namespace], object]] = {
    "resctrl": _resctrl,
    "sim": _sim,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="resctrl",
        help="which node to describe (default resctrl)",
    )
    parser.add_argument(
        "--root", default="/sys/fs/resctrl", help="resctrl mount point (default /sys/fs/resctrl)"
    )
    parser.add_argument(
        "--prefix",
        default="rdtune-",
        help="directory prefix of the groups the node owns (default rdtune-)",
    )
    parser.add_argument(
        "--state-dir",
        help="resctrl: where the agent keeps its groups' kinds and SLOs (default "
        "$RDTUNE_STATE_DIR, else /var/lib/rdtune for root, else $XDG_STATE_HOME/rdtune or "
        "~/.local/state/rdtune); only read: describe changes nothing, and works beside a "
        "running agent",
    )
    parser.add_argument("--scenario", help="sim: scenario name (default: the built-in one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def describe(node) -> dict:
    """Capabilities and own groups of ``node`` as plain data."""
    caps = node.capabilities()
    out: dict = {
        "description": caps.description,
        "vendor": caps.vendor.value,
        "num_cpus": caps.num_cpus,
        "num_closids": caps.num_closids,
        "domains": list(caps.domains),
        "l3": None,
        "mba": None,
        "monitoring": None,
        "pmc_events": sorted(caps.pmc_events),
        "pmc_unsupported": dict(caps.pmc_unsupported),
    }
    if caps.l3:
        out["l3"] = {
            "ways": caps.l3.num_ways,
            "cbm_mask": f"{caps.l3.cbm_mask:#x}",
            "min_cbm_bits": caps.l3.min_cbm_bits,
            "shareable_bits": f"{caps.l3.shareable_bits:#x}",
            "sparse_masks": caps.l3.sparse_masks,
            "cdp": caps.l3.cdp,
            "num_closids": caps.l3.num_closids,
            "size_bytes": caps.l3.size_bytes,
        }
    if caps.mba:
        out["mba"] = {
            "mode": caps.mba.mode.value,
            "min": caps.mba.min_bandwidth,
            "gran": caps.mba.bandwidth_gran,
            "max": caps.mba.max_bandwidth,
            "num_closids": caps.mba.num_closids,
        }
    if caps.monitoring:
        out["monitoring"] = {
            "num_rmids": caps.monitoring.num_rmids,
            "features": sorted(caps.monitoring.features),
        }
    alloc = node.allocation()
    out["groups"] = {
        name: {
            "kind": spec.kind.value,
            "slo": None
            if spec.slo is None
            else {"percentile": spec.slo.percentile, "target_ms": spec.slo.target_ms},
            "exclusive": spec.exclusive,
            "allocation": {
                str(d): {
                    "l3_mask": None if a.l3_mask is None else f"{a.l3_mask:#x}",
                    "l3_code_mask": None if a.l3_code_mask is None else f"{a.l3_code_mask:#x}",
                    "mb": a.mb,
                }
                for d, a in (alloc.groups.get(name) or {}).items()
            },
        }
        for name, spec in sorted(node.groups().items())
    }
    vanished = getattr(node, "vanished", None)
    out["vanished"] = sorted(vanished()) if callable(vanished) else []
    prefix = getattr(node, "prefix", "")
    out["not_ours"] = [prefix + n for n in sorted(getattr(node, "not_ours", ()))]
    return out


def format_text(d: dict) -> str:
    lines = [
        f"node: {d['description']}",
        f"  vendor {d['vendor']}, {d['num_cpus']} CPUs, {d['num_closids']} CLOSIDs, "
        f"domains {d['domains']}",
    ]
    if d["l3"]:
        l3 = d["l3"]
        size = f", {l3['size_bytes'] // 1024} KiB" if l3["size_bytes"] else ""
        lines.append(
            f"  L3: {l3['ways']} ways (cbm {l3['cbm_mask']}), min {l3['min_cbm_bits']} "
            f"bits, shareable {l3['shareable_bits']}, sparse {l3['sparse_masks']}, "
            f"CDP {l3['cdp']}{size}"
        )
    else:
        lines.append("  L3: no cache allocation")
    if d["mba"]:
        m = d["mba"]
        lines.append(
            f"  MB: {m['mode']} {m['min']}..{m['max']} step {m['gran']}, {m['num_closids']} CLOSIDs"
        )
    else:
        lines.append("  MB: no bandwidth allocation")
    if d["monitoring"]:
        lines.append(
            f"  monitoring: {d['monitoring']['num_rmids']} RMIDs, "
            f"{', '.join(d['monitoring']['features'])}"
        )
    lines.append(f"  PMC events: {', '.join(d['pmc_events']) or 'none'}")
    for event, why in sorted(d["pmc_unsupported"].items()):
        lines.append(f"    {event}: unsupported ({why})")
    lines.append(f"groups ({len(d['groups'])}):")
    for name, g in d["groups"].items():
        slo = f", p{g['slo']['percentile']:g} <= {g['slo']['target_ms']:g} ms" if g["slo"] else ""
        excl = ", exclusive" if g["exclusive"] else ""
        lines.append(f"  {name}: {g['kind']}{slo}{excl}")
        for dom, a in g["allocation"].items():
            code = f" code {a['l3_code_mask']}" if a["l3_code_mask"] else ""
            lines.append(f"    domain {dom}: L3 {a['l3_mask']}{code}, MB {a['mb']}")
    if d["vanished"]:
        lines.append(f"vanished (deleted by someone else): {', '.join(d['vanished'])}")
    if d.get("not_ours"):
        lines.append(f"not created by this node (left alone): {', '.join(d['not_ours'])}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import sys

    from agent.errors import NodeError

    try:
        node = BACKENDS[args.backend](args)
    except (OSError, ValueError, KeyError, NodeError) as exc:
        print(f"rdtune describe: cannot open the {args.backend} node: {exc}", file=sys.stderr)
        return 1
    try:
        d = describe(node)
    finally:
        node.close()
    print(json.dumps(d, indent=2) if args.json else format_text(d))
    return 0
