"""The machine a benchmark ran on, in one line: CPU model, cores, Python, torch when installed.

python benchmarks/_machine.py
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform

__all__ = ["cpu_model", "machine_line"]


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), or what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _torch_version() -> str | None:
    """The installed torch's version, read from its metadata: importing torch takes seconds."""
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def machine_line() -> str:
    """E.g. `AMD EPYC 7B13, 2 cores (2 usable), Linux 6.1 x86_64, CPython 3.11.7, torch 2.4.0`."""
    parts = [
        cpu_model(),
        f"{os.cpu_count() or 1} cores ({_usable_cores()} usable)",
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"{platform.python_implementation()} {platform.python_version()}",
    ]
    torch = _torch_version()
    if torch is not None:
        parts.append(f"torch {torch}")
    return ", ".join(parts)


if __name__ == "__main__":
    print(machine_line())
