"""`vkspec doctor`: what this machine gives vkspec, one line per item, each
with a verdict (ok, warn, fail, info): the Vulkan device and driver, whether
it is a GPU, its float controls and the start-up probe, the CPU's vector
width and the kernels chosen, the CPU's float environment, the pages its
weights are mapped in, and where kp, the
caches and the draft-vocabulary counts live. Exit status 1 when an item
fails (vkspec cannot run that way), else 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

VERDICTS = ("ok", "warn", "fail", "info")


@dataclass
class Item:
    verdict: str
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.verdict:<4}  {self.what:<14} {self.detail}"


def _vulkan() -> list[Item]:
    from .backends.vulkan import vkinfo
    from .backends.vulkan.device import float_modes
    from .shaders.float_controls import MODES
    index = int(os.environ.get("VKSPEC_DEVICE", "0"))
    try:
        found = vkinfo.devices()
    except (vkinfo.VulkanInfoError, OSError, AttributeError) as e:
        return [Item("fail", "vulkan", f"no Vulkan: {e}"), Item("warn", "gpu", "none found (no Vulkan)")]
    if not found:
        return [Item("fail", "vulkan", "the Vulkan loader sees no device (install a driver: Mesa's "
                                       "mesa-vulkan-drivers has Lavapipe)"),
                Item("warn", "gpu", "none found")]
    if index >= len(found):
        return [Item("fail", "vulkan", f"VKSPEC_DEVICE={index}, but the loader sees {len(found)} device(s)")]
    d = found[index]
    out = [Item("ok", "vulkan", f"device {index}: {d.name} ({d.type}, Vulkan {d.api}), driver {d.driver}")]
    gpus = [g for g in found if g.is_gpu]
    if d.is_gpu:
        out.append(Item("ok", "gpu", f"yes: {d.name}"))
    elif gpus:
        out.append(Item("warn", "gpu", f"{gpus[0].name} is a GPU, but device {index} is not: "
                                       f"VKSPEC_DEVICE={gpus[0].index} picks it"))
    else:
        out.append(Item("warn", "gpu", f"none: {d.name} runs shaders on the CPU (Lavapipe: right bits, "
                                       "slow); vkspec's speed is a GPU's"))
    if d.float_controls is None:
        out.append(Item("warn", "float controls", "none offered (VK_KHR_shader_float_controls missing): "
                                                  "the shaders declare none; the probe decides"))
    else:
        modes = float_modes(d)
        missing = [m for m in MODES if m not in modes]
        detail = f"declared: {', '.join(modes) or 'none'}"
        if missing:
            detail += f"; not offered: {', '.join(missing)} (the probe checks that behaviour instead)"
        out.append(Item("ok" if modes else "warn", "float controls", detail))
    return out


def _probe() -> Item:
    from .backends.vulkan.device import Device
    from .errors import DeviceError
    try:
        dev = Device(check=False)
    except DeviceError as e:
        return Item("fail", "device probe", str(e))
    p = dev.probe
    return Item("ok" if p.ok else "fail", "device probe",
                p.line() if p.ok else f"{p.line()}: the device is refused (--fallback cpu runs on the CPU)")


def _cpu() -> list[Item]:
    from .backends.cpu import fpenv
    from .backends.cpu.isa import kernel_choice
    out = [Item("ok", "cpu", kernel_choice().line())]
    try:
        from .backends.cpu import qdot
        qdot.lib()
        out.append(Item("ok", "cpu q8", f"integer block dots: {qdot.variant()} (--activations q8; "
                                        "VKSPEC_CPU_ISA=avx2 or plain caps it)"))
    except Exception as e:                  # noqa: BLE001 - a missing compiler, a forced ISA this CPU lacks
        out.append(Item("warn", "cpu q8", f"no q8 kernel: {e} (--activations f32 still runs)"))
    res = fpenv.check()
    out.append(Item("ok" if res.ok else "warn", "cpu float",
                    res.line() if res.ok else f"{res.line()} (vkspec clears FTZ/DAZ at load where it can)"))
    return out + [_pages()]


def _pages() -> Item:
    import platform
    import sys

    from . import pages
    if pages.huge_pages_on():
        return Item("ok", "cpu pages", f"2 MB where the page cache holds a file in 2 MB folios (Linux "
                                       f"{platform.release()}; ext4 gives them from 6.16, xfs); "
                                       "VKSPEC_HUGE_PAGES=0 keeps 4 KB")
    if os.environ.get("VKSPEC_HUGE_PAGES") == "0":
        return Item("info", "cpu pages", "4 KB (VKSPEC_HUGE_PAGES=0)")
    if not sys.platform.startswith("linux"):
        return Item("info", "cpu pages", "4 KB (2 MB pages of a mapped file: Linux only)")
    return Item("warn", "cpu pages", f"4 KB: transparent huge pages are off ({pages._THP}); a decoding step "
                                     "streams every weight and runs about a tenth slower from 4 KB pages")


def _places(model) -> list[Item]:
    import importlib.metadata
    import importlib.util
    from .cachedir import cache_root
    out = []
    spec = importlib.util.find_spec("kp")
    if spec is None:
        out.append(Item("fail", "kp", "not installed: ci/kompute/build-kp.sh builds the wheel (see the README)"))
    else:
        try:
            version = importlib.metadata.version("kp")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        out.append(Item("ok", "kp", f"{version} at {spec.origin}"))
    root = cache_root()
    wheels = Path(os.environ.get("VKSPEC_CACHE") or root) / "kp"
    built = sorted(wheels.glob("*/kp-*.whl"))
    out.append(Item("info", "kp wheels", f"{len(built)} cached in {wheels}" if built else
                    f"none cached ({wheels}: ci/kompute/build-kp.sh puts them there)"))
    out.append(Item("info", "cache", f"{root}{'' if root.exists() else ' (not made yet)'}"))
    try:
        from .backends.cpu import jit
        numba_dir = jit._gemv._cache._cache_path
    except Exception as e:                    # noqa: BLE001 - a report
        numba_dir = f"? ({e})"
    out.append(Item("info", "numba cache", str(numba_dir)))
    if model is not None:
        from .speculative.vocab import counts_location
        cache, shipped = counts_location(model)
        where = f"{cache}{'' if cache is not None and cache.exists() else ' (not written yet)'}"
        if shipped is not None and shipped.exists():
            where += f"; starting counts shipped read-only at {shipped}"
        out.append(Item("info", "counts", where))
    else:
        out.append(Item("info", "counts", f"{root / 'models'}/<model key>/ (vkspec doctor MODEL names "
                                          "a model's folder)"))
    return out


def items(model=None, device: bool = True) -> list[Item]:
    out = _vulkan() if device else []
    if device and not any(i.verdict == "fail" for i in out):
        out.append(_probe())
    return out + _cpu() + _places(model)


def main(model=None) -> int:
    found = items(model)
    for item in found:
        print(item.line(), flush=True)
    return 1 if any(i.verdict == "fail" for i in found) else 0
