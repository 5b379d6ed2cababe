"""Run Intel's ``pqos`` (intel-cmt-cat) against a mounted emulator, unmodified.

pqos only talks to /sys/fs/resctrl, so each run happens in a private mount namespace
(``unshare --mount``) where:

- the emulator's mount is bind-mounted at /sys/fs/resctrl (over a tmpfs on /sys/fs when
  the host kernel has no resctrl directory);
- the preset's CPU topology (``Topology.write_sysfs``) is bind-mounted over
  /sys/devices/system/cpu, since pqos maps schemata domain ids to the L3 ids and packages
  it reads there (lib/os_cpuinfo.c);
- /proc/cpuinfo gains the RDT flags pqos looks for (``cqm``, ``cdp_l3``, ...) and
  /proc/filesystems a ``nodev resctrl`` line (lib/resctrl.c ``resctrl_is_supported``).

pqos picks its vendor code path from CPUID, not from /proc/cpuinfo, and its AMD path
cannot show or reset an allocation (``-s``/``-R`` fail on a correct tree). So the vendor is
read from /proc/cpuinfo: on an Intel host pqos runs as it is; on any other host it runs
under qemu-user with an Intel CPU model (``qemu-x86_64 -cpu Skylake-Server``), the same
binary with Intel's CPUID answers. Everything else (files, namespaces, /proc) is the host's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from tests.emulated_resctrl import Emulated, skip_or_fail

QEMU_CPU = "Skylake-Server"  # an Intel model with CAT/MBA-era CPUID (Xeon Scalable)
RDT_FLAGS = "rdt_a cat_l3 cdp_l3 cqm cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local mba"
TIMEOUT_S = 60

# $1 emulator mountpoint, $2 CPU sysfs tree, $3 scratch dir; the rest is the command.
NAMESPACE_SCRIPT = r"""
set -e
root=$1 cpu=$2 dir=$3
shift 3
sed "/^flags/s/\$/ $RDT_FLAGS/" /proc/cpuinfo > "$dir/cpuinfo"
{ cat /proc/filesystems; printf 'nodev\tresctrl\n'; } > "$dir/filesystems"
mount --bind "$dir/cpuinfo" /proc/cpuinfo
mount --bind "$dir/filesystems" /proc/filesystems
if [ ! -d /sys/fs/resctrl ]; then
    mount -t tmpfs rdtune-sysfs /sys/fs
    mkdir /sys/fs/resctrl
fi
mount --bind "$root" /sys/fs/resctrl
mount --bind "$cpu" /sys/devices/system/cpu
exec "$@"
"""


def host_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """``vendor_id`` of the host's first CPU (GenuineIntel, AuthenticAMD, ...)."""
    with open(cpuinfo) as f:
        for line in f:
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def pqos_command(vendor: str) -> tuple[list[str], str | None]:
    """The command that runs pqos on Intel's code path here, or why it cannot run."""
    pqos = shutil.which("pqos") or next(
        (p for p in ("/usr/sbin/pqos", "/usr/local/sbin/pqos") if os.access(p, os.X_OK)), None
    )
    if pqos is None:
        return [], "pqos not found (install intel-cmt-cat: scripts/setup.sh does as root)"
    if vendor == "GenuineIntel":
        return [pqos], None
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        return [], (
            f"this host's CPU is {vendor}, so pqos must run under qemu-user with an Intel "
            "model, and qemu-x86_64 is missing (install qemu-user: scripts/setup.sh does)"
        )
    return [qemu, "-cpu", QEMU_CPU, pqos], None


def namespace_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root to bind-mount in a private mount namespace"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not found"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot create a mount namespace: {probe.stderr.strip()}"
    return None


@dataclass
class Pqos:
    """pqos in OS-interface mode (``-I``) against one mounted emulator."""

    emu: Emulated
    command: list[str]
    cpu_sysfs: str = field(default="")
    scratch: str = field(default="")

    @classmethod
    def for_emulator(cls, emu: Emulated) -> Pqos:
        why = namespace_missing()
        command, missing = pqos_command(host_vendor())
        why = why or missing
        if why:
            skip_or_fail(f"pqos interoperability: {why}")
        scratch = tempfile.mkdtemp(prefix="rdtune-pqos-")
        cpu = os.path.join(scratch, "cpu")
        p = emu.model.p
        emu.model.topo.write_sysfs(cpu, p.cache_size, p.cbm_len)
        return cls(emu, command, cpu, scratch)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def argv(self, *args: str) -> list[str]:
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            NAMESPACE_SCRIPT,
            "sh",
            self.emu.root,
            self.cpu_sysfs,
            self.scratch,
            *self.command,
            "-I",
            *args,
        ]

    def env(self) -> dict[str, str]:
        return {**os.environ, "RDT_FLAGS": RDT_FLAGS, "LC_ALL": "C"}

    def run(self, *args: str) -> str:
        """Run pqos to the end; its output (stdout and stderr, qemu's notes removed)."""
        done = subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=self.env(),
            check=False,
        )
        return _clean(done.stdout + done.stderr) + f"\n(exit status {done.returncode})"

    def start(self, *args: str) -> subprocess.Popen:
        """Start pqos (a monitoring run) in the background."""
        return subprocess.Popen(
            self.argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env(),
        )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=TIMEOUT_S)
    return _clean(out) + f"\n(exit status {proc.returncode})"


def _clean(text: str) -> str:
    # qemu warns about every host-unsupported feature of the CPU model it emulates
    return "\n".join(line for line in text.splitlines() if "TCG doesn't support" not in line)
