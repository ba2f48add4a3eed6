"""What the benchmarks ran on, recorded in every results.json (no flags: tests import it)."""

from __future__ import annotations

# The CPU features that decide TensorFlow's CPU kernels: oneDNN is on by default only with
# AVX-512 VNNI / BF16 or AMX, and the matmul peak differs by ~2.5x between the AVX2 and AVX-512
# hosts these benchmarks have run on, so every result says which one it came from.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def _read(path: str) -> str | None:
    """A /proc file's text, or None where there is none (not Linux, an ended process)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpu_features(cpuinfo: str | None = None) -> dict:
    """{"cpu_model": str, "cpu_flags": [those of CPU_FLAGS present]} from /proc/cpuinfo's text
    (read when not given); an empty model and no flags where there is none (not Linux)."""
    if cpuinfo is None:
        cpuinfo = _read("/proc/cpuinfo") or ""
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {"cpu_model": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags]}


def _kib_field(text: str, name: str) -> int | None:
    """The value of a "Name:   123 kB" line of a /proc file's text, in bytes."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return int(value.split()[0]) * 1024
    return None


def available_memory_bytes(meminfo: str | None = None) -> int | None:
    """MemAvailable of /proc/meminfo's text (read when not given): what the kernel can hand out
    without swapping; None where there is none (not Linux)."""
    if meminfo is None:
        meminfo = _read("/proc/meminfo")
    return None if meminfo is None else _kib_field(meminfo, "MemAvailable")


def peak_rss_bytes(pid: int, status: str | None = None) -> int | None:
    """VmHWM of /proc/<pid>/status' text (read when not given): the process' peak resident
    memory so far; None where there is none (an ended process, not Linux)."""
    if status is None:
        status = _read(f"/proc/{pid}/status")
    return None if status is None else _kib_field(status, "VmHWM")
