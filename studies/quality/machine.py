"""How much of this machine other processes used while a run trained (Linux /proc readings)."""

from __future__ import annotations

import os
import time
from pathlib import Path

Reading = tuple[float, float, float]


def machine_cpu() -> Reading:
    """(time, CPU seconds busy on the whole machine, CPU seconds of this process and its children).

    Zeros for the CPU figures where /proc cannot be read; the difference between two readings
    tells how much of the machine other work took meanwhile (``other_cpu``).
    """
    try:
        hz = os.sysconf("SC_CLK_TCK")
        f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(f) - f[3] - f[4]) / hz  # all but idle and iowait
        pids = {os.getpid()}
        for task in Path("/proc/self/task").iterdir():
            pids.update(int(c) for c in (task / "children").read_text().split())
        ours = 0.0
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # a child that ended meanwhile
                continue
            ours += (int(stat[11]) + int(stat[12]) + int(stat[13]) + int(stat[14])) / hz
        return time.monotonic(), busy, ours
    except (OSError, ValueError):
        return time.monotonic(), 0.0, 0.0


def other_cpu(a: Reading, b: Reading) -> float:
    """Fraction of the machine's cores other processes kept busy between readings ``a`` and ``b``."""
    span = (b[0] - a[0]) * (os.cpu_count() or 1)
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / span if span > 0 else 0.0


def software() -> dict[str, str]:
    """What a run's numbers depend on besides the code and the seed: the CPU model, the SIMD
    level torch's kernels use, and the versions of the packages that decode and train.

    The same configuration and seed reproduce every digit on one machine, not across machines
    (docs/quality.md): the CPU's kernels round differently, and the difference grows with
    training. A result file records these so two runs can be told apart.
    """
    from importlib.metadata import PackageNotFoundError, version

    import torch

    cpu = "unknown"
    try:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")), cpu)  # fmt: skip
    except OSError:
        pass
    out = {"cpu": cpu, "cpu_capability": str(torch.backends.cpu.get_cpu_capability())}
    for pkg in PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


PACKAGES = ("torch", "numpy", "pillow", "webdataset", "pyarrow", "polars")
MACHINE_KEYS = ("cpu", "cpu_capability", *PACKAGES)


def machine_of(result: dict) -> str:
    """The machine a result file says it ran on: its recorded CPU model, SIMD level and package
    versions (``software``), or ``not recorded`` (files written before ``software`` existed).
    Two files with the same text may still come from two hosts of the same model."""
    sw = result.get("software")
    if not sw:
        return "not recorded"
    return ", ".join(f"{k} {sw[k]}" if k != "cpu" else sw[k] for k in MACHINE_KEYS if k in sw)
