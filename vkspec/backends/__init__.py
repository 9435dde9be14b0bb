"""Two backends behind one interface (vkspec.interface.Model): ``cpu`` (NumPy,
the definition) and ``vulkan`` (the same ops as compute shaders, recorded into
one sequence per step shape). Each op is one function in cpu/ops.py and one
shader of the same name in vkspec/shaders.

``get_ops`` gives each backend's ops one call at a time (the Vulkan side
uploads, dispatches once and reads back): the selftest and the op tests
compare the two that way, op by op.
"""

from __future__ import annotations


def get_ops(name: str):
    if name == "cpu":
        from .cpu.ops import CpuOps
        return CpuOps()
    if name == "vulkan":
        from .vulkan.immediate import VulkanOps
        return VulkanOps()
    raise ValueError(f"unknown backend {name!r} (cpu or vulkan)")
