"""What the CPU offers the compiled kernels, and which kernels run on it.

Today there is one set: the numba kernels of jit*.py, compiled by LLVM for
this host (numba's default target), whatever the vector width; the lane
order is fixed by exact.py, not by the width, so every choice gives the same
bits. :func:`kernel_choice` is the one place that says what was chosen: a
later per-width set (AVX2 / AVX-512 blockings of the same lanes) changes
what it returns, and ``vkspec doctor`` prints it.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Isa:
    name: str             # "AVX-512", "AVX2", "AVX", "SSE4.2", "SVE", "NEON", or the machine name
    vector_bits: int      # the widest float vector (0: not known)
    cpu: str              # the model name


@dataclass(frozen=True)
class KernelChoice:
    kernels: str          # what runs the CPU path's GEMV and reductions
    target: str           # what they are compiled for
    isa: Isa

    def line(self) -> str:
        bits = f", {self.isa.vector_bits}-bit vectors" if self.isa.vector_bits else ""
        return f"{self.isa.name}{bits} ({self.isa.cpu}); kernels: {self.kernels} for {self.target}"


def _cpuinfo() -> tuple[str, set[str]]:
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "CPU part") and name in ("", platform.machine()):
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name, flags


@lru_cache(maxsize=None)
def isa() -> Isa:
    """The widest vector instruction set this CPU has (from /proc/cpuinfo's flags)."""
    cpu, flags = _cpuinfo()
    for flag, name, bits in (("avx512f", "AVX-512", 512), ("avx2", "AVX2", 256), ("avx", "AVX", 256),
                             ("sse4_2", "SSE4.2", 128), ("sve", "SVE", 0), ("asimd", "NEON", 128)):
        if flag in flags:
            return Isa(name, bits, cpu)
    return Isa(platform.machine() or "unknown", 0, cpu)


def kernel_choice() -> KernelChoice:
    """The CPU kernels this process runs, and what they are compiled for."""
    from . import jit
    if not jit.enabled():
        return KernelChoice("NumPy (the definition; VKSPEC_CPU_JIT=0)", "any CPU", isa())
    try:
        from llvmlite import binding as llvm
        host = llvm.get_host_cpu_name()
    except Exception:                       # noqa: BLE001 - only a name for the report
        host = "the host"
    target = os.environ.get("NUMBA_CPU_NAME") or host
    from .jit_ir import ISA
    return KernelChoice(f"numba, dot products as LLVM IR for {ISA} (VKSPEC_CPU_ISA forces one)",
                        f"LLVM target {target}", isa())
