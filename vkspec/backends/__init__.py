"""Two backends behind one small interface: ``cpu`` (NumPy, the definition)
and ``vulkan`` (the same ops as compute shaders). Each op is one function on
the CPU and one shader of the same name on the device."""

from __future__ import annotations


def get_backend(name: str):
    if name == "cpu":
        from .cpu import CpuOps
        return CpuOps()
    if name == "vulkan":
        from .vulkan import VulkanOps
        return VulkanOps()
    raise ValueError(f"unknown backend {name!r} (cpu or vulkan)")
