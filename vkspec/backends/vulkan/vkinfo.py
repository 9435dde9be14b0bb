"""What kp cannot tell about a Vulkan device: its driver and its float
controls (VkPhysicalDeviceFloatControlsProperties), read with a few Vulkan
calls through ctypes.

Why ctypes into libvulkan.so.1: kp 0.9.0's get_device_properties() gives the
name and limits only; vulkaninfo is a separate package (vulkan-tools) whose
text format changes between versions. libvulkan.so.1 is the loader kp itself
links, so it is present wherever kp runs, and the Vulkan C ABI is stable. The
query is vkGetPhysicalDeviceProperties2 (core in 1.1, the version kp's
instance asks for) with the float-controls and driver structs chained in
``pNext`` when the device lists their extensions (VK_KHR_shader_float_controls,
VK_KHR_driver_properties; both are core in 1.2). A short-lived instance of our
own, destroyed at once, so nothing here touches kp's. Devices are enumerated in
the loader's order, the order kp.Manager(index) uses.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

VK_SUCCESS, VK_INCOMPLETE = 0, 5
ST_APPLICATION_INFO, ST_INSTANCE_CREATE_INFO = 0, 1
ST_PROPERTIES_2 = 1000059001
ST_DRIVER_PROPERTIES = 1000196000
ST_FLOAT_CONTROLS_PROPERTIES = 1000197000
API_1_1 = (1 << 22) | (1 << 12)
FLOAT_CONTROLS_EXT = "VK_KHR_shader_float_controls"
DRIVER_PROPERTIES_EXT = "VK_KHR_driver_properties"
DEVICE_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
INDEPENDENCE = {0: "32-bit only", 1: "all", 2: "none"}

_p = ctypes.c_void_p
_u32 = ctypes.c_uint32


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", _u32), ("pNext", _p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", _u32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", _u32), ("apiVersion", _u32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", _u32), ("pNext", _p), ("flags", _u32), ("pApplicationInfo", ctypes.POINTER(_AppInfo)),
                ("enabledLayerCount", _u32), ("ppEnabledLayerNames", _p),
                ("enabledExtensionCount", _u32), ("ppEnabledExtensionNames", _p)]


class _ExtensionProperties(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", _u32)]


class _Properties2(ctypes.Structure):
    # VkPhysicalDeviceProperties is 824 bytes on 64-bit; only its head is read:
    # apiVersion, driverVersion, vendorID, deviceID, deviceType, deviceName[256]
    _fields_ = [("sType", _u32), ("pNext", _p), ("apiVersion", _u32), ("driverVersion", _u32),
                ("vendorID", _u32), ("deviceID", _u32), ("deviceType", _u32),
                ("deviceName", ctypes.c_char * 256), ("rest", ctypes.c_uint8 * (824 - 276))]


class _DriverProperties(ctypes.Structure):
    _fields_ = [("sType", _u32), ("pNext", _p), ("driverID", _u32), ("driverName", ctypes.c_char * 256),
                ("driverInfo", ctypes.c_char * 256), ("conformanceVersion", ctypes.c_uint8 * 4)]


_FLOAT_FLAGS = [f"{what}Float{w}" for what in ("shaderSignedZeroInfNanPreserve", "shaderDenormPreserve",
                                                "shaderDenormFlushToZero", "shaderRoundingModeRTE",
                                                "shaderRoundingModeRTZ") for w in (16, 32, 64)]


class _FloatControls(ctypes.Structure):
    _fields_ = [("sType", _u32), ("pNext", _p), ("denormBehaviorIndependence", _u32),
                ("roundingModeIndependence", _u32)] + [(f, _u32) for f in _FLOAT_FLAGS]


@dataclass
class FloatControls:
    """The 32-bit float controls a shader may declare on this device."""
    signed_zero_inf_nan_preserve: bool = False
    denorm_preserve: bool = False
    denorm_flush_to_zero: bool = False
    rounding_rte: bool = False
    rounding_rtz: bool = False
    denorm_independence: str = "?"
    rounding_independence: str = "?"

    def line(self) -> str:
        on = [n for n, v in (("SignedZeroInfNanPreserve", self.signed_zero_inf_nan_preserve),
                             ("DenormPreserve", self.denorm_preserve),
                             ("RoundingModeRTE", self.rounding_rte)) if v]
        off = [n for n, v in (("SignedZeroInfNanPreserve", self.signed_zero_inf_nan_preserve),
                              ("DenormPreserve", self.denorm_preserve),
                              ("RoundingModeRTE", self.rounding_rte)) if not v]
        return (", ".join(on) or "none") + (f" (not offered: {', '.join(off)})" if off else "")


@dataclass
class DeviceInfo:
    index: int
    name: str
    type: str
    api: str
    vendor_id: int
    driver_name: str = "?"
    driver_info: str = ""
    extensions: set = field(default_factory=set)
    float_controls: FloatControls | None = None     # None: the device offers no float controls

    @property
    def is_gpu(self) -> bool:
        return self.type in ("integrated GPU", "discrete GPU", "virtual GPU")

    @property
    def driver(self) -> str:
        return f"{self.driver_name} {self.driver_info}".strip()


class VulkanInfoError(RuntimeError):
    pass


def _lib():
    try:
        return ctypes.CDLL("libvulkan.so.1")
    except OSError as e:
        raise VulkanInfoError(f"the Vulkan loader (libvulkan.so.1) is missing: {e}") from None


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def devices() -> list[DeviceInfo]:
    """Every physical device the loader sees, in kp's order."""
    vk = _lib()
    vk.vkCreateInstance.argtypes = [ctypes.POINTER(_InstanceInfo), _p, ctypes.POINTER(_p)]
    vk.vkDestroyInstance.argtypes = [_p, _p]
    vk.vkEnumeratePhysicalDevices.argtypes = [_p, ctypes.POINTER(_u32), ctypes.POINTER(_p)]
    vk.vkEnumerateDeviceExtensionProperties.argtypes = [_p, ctypes.c_char_p, ctypes.POINTER(_u32),
                                                        ctypes.POINTER(_ExtensionProperties)]
    vk.vkGetPhysicalDeviceProperties2.argtypes = [_p, ctypes.POINTER(_Properties2)]
    vk.vkGetPhysicalDeviceProperties2.restype = None
    app = _AppInfo(ST_APPLICATION_INFO, None, b"vkspec-info", 1, b"vkspec", 1, API_1_1)
    info = _InstanceInfo(ST_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    inst = _p()
    rc = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(inst))
    if rc != VK_SUCCESS:
        raise VulkanInfoError(f"vkCreateInstance failed ({rc})")
    try:
        n = _u32(0)
        vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), None)
        handles = (_p * n.value)()
        rc = vk.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), handles)
        if rc not in (VK_SUCCESS, VK_INCOMPLETE):
            raise VulkanInfoError(f"vkEnumeratePhysicalDevices failed ({rc})")
        return [_describe(vk, i, _p(h)) for i, h in enumerate(handles[:n.value])]
    finally:
        vk.vkDestroyInstance(inst, None)


def _describe(vk, index: int, phys) -> DeviceInfo:
    n = _u32(0)
    vk.vkEnumerateDeviceExtensionProperties(phys, None, ctypes.byref(n), None)
    exts = (_ExtensionProperties * n.value)()
    vk.vkEnumerateDeviceExtensionProperties(phys, None, ctypes.byref(n), exts)
    names = {e.extensionName.decode() for e in exts[:n.value]}
    props = _Properties2(sType=ST_PROPERTIES_2)
    chain = None
    fc = drv = None
    # a struct goes into the chain only where the device lists its extension
    # (the validation layer rejects any other)
    if FLOAT_CONTROLS_EXT in names:
        fc = _FloatControls(sType=ST_FLOAT_CONTROLS_PROPERTIES, pNext=chain)
        chain = ctypes.cast(ctypes.pointer(fc), _p)
    if DRIVER_PROPERTIES_EXT in names:
        drv = _DriverProperties(sType=ST_DRIVER_PROPERTIES, pNext=chain)
        chain = ctypes.cast(ctypes.pointer(drv), _p)
    props.pNext = chain
    vk.vkGetPhysicalDeviceProperties2(phys, ctypes.byref(props))
    out = DeviceInfo(index, props.deviceName.decode(errors="replace"),
                     DEVICE_TYPES.get(props.deviceType, "other"), _version(props.apiVersion), props.vendorID,
                     extensions=names)
    if drv is not None:
        out.driver_name = drv.driverName.decode(errors="replace")
        out.driver_info = drv.driverInfo.decode(errors="replace")
    if fc is not None:
        out.float_controls = FloatControls(
            signed_zero_inf_nan_preserve=bool(fc.shaderSignedZeroInfNanPreserveFloat32),
            denorm_preserve=bool(fc.shaderDenormPreserveFloat32),
            denorm_flush_to_zero=bool(fc.shaderDenormFlushToZeroFloat32),
            rounding_rte=bool(fc.shaderRoundingModeRTEFloat32),
            rounding_rtz=bool(fc.shaderRoundingModeRTZFloat32),
            denorm_independence=INDEPENDENCE.get(fc.denormBehaviorIndependence, "?"),
            rounding_independence=INDEPENDENCE.get(fc.roundingModeIndependence, "?"))
    return out


def device(index: int) -> DeviceInfo | None:
    """The device kp.Manager(index) opens; None when the loader cannot say."""
    try:
        found = devices()
    except (VulkanInfoError, OSError, AttributeError):
        return None
    return found[index] if 0 <= index < len(found) else None
