"""The Vulkan device through Kompute (kp): shaders, tensors, push constants.

Everything vkspec asks of kp goes through here, so kp 0.9.0's quirks are
handled once:

* kp takes the push-constant dtype from the spec-constant array's dtype, so
  every algorithm gets empty uint32 spec constants and uint32 push constants;
  :meth:`Shader.pack` writes a shader's push struct (vkspec/shaders/push.py,
  checked against the SPIR-V at build time) into those words.
* The patched kp (ci/kompute) records a global barrier before every dispatch
  and copy, so a recorded sequence of dependent dispatches is hazard-free.
* kp reports a failed Vulkan call (out of device memory, device lost, a
  failed submission or pipeline) as a RuntimeError (MemoryError for a host
  allocation). :func:`device_calls` turns those into one-line DeviceErrors;
  it wraps this class's calls and the model's interface (model.py), so no
  other file needs to know what kp raises.
* Float controls: every shader declares the 32-bit float modes the device
  offers among SignedZeroInfNanPreserve, DenormPreserve and RoundingModeRTE
  (read through vkinfo.py, added to the SPIR-V by shaders/float_controls.py,
  with VK_KHR_shader_float_controls enabled on the device); then the
  start-up probe (probe.py) checks what the device really computes.
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import DeviceError, VkspecError
from ...shaders import float_controls
from ...shaders import push as push_structs
from ...shaders.build import ShaderError
from ...shaders.spirv import Reflection, reflect

SHADER_DIR = Path(__file__).resolve().parents[2] / "shaders"
FILL_GROUPS = 1024          # workgroups of a fill; each invocation strides over the words
READ_WORDS = 1 << 18        # the readback buffer (1 MiB)
FILL_CACHE = 256            # fill algorithms kept (the chain's arenas need a few dozen)
KP_ERRORS = (RuntimeError, MemoryError, SystemError)

__all__ = ["Device", "DeviceError", "Shader", "device_calls", "get_device", "load_shader"]


def failure(what: str, e: BaseException) -> DeviceError:
    """A DeviceError of one line for a failed device call."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return DeviceError(f"the Vulkan device failed {what}: {first}")


@contextlib.contextmanager
def device_calls(what: str):
    """Inside: a failed kp call becomes DeviceError("the Vulkan device failed
    <what>: <kp's first line>"). vkspec's own errors pass as they are."""
    try:
        yield
    except (VkspecError, ShaderError):
        raise
    except KP_ERRORS as e:
        raise failure(what, e) from e


def on_device(what: str):
    """device_calls around a whole method."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with device_calls(what):
                return fn(*args, **kwargs)
        return inner
    return wrap


def _import_kp():
    try:
        import kp
    except ImportError as e:  # pragma: no cover - exercised on broken installs
        raise DeviceError("the kp (Kompute) module is not installed: run `make setup`") from e
    return kp


@dataclass(frozen=True)
class Shader:
    """One compiled variant of one .comp file and what it declares."""
    stem: str
    name: str
    spirv: bytes
    reflection: Reflection

    def pack(self, value) -> np.ndarray:
        """A push struct (vkspec.shaders.push) as the uint32 words kp pushes."""
        want = push_structs.PUSH.get(self.stem)
        if type(value) is not want:
            raise TypeError(f"{self.name} takes {want.__name__ if want else 'no push constants'}, "
                            f"got {type(value).__name__}")
        return np.frombuffer(push_structs.pack(value), dtype=np.uint32).copy()


@functools.lru_cache(maxsize=None)
def load_shader(stem: str, variant: str | None = None) -> Shader:
    """Load <stem>[.<variant>].spv, recompiling it first when its source is newer."""
    src = SHADER_DIR / f"{stem}.comp"
    name = f"{stem}.{variant}.spv" if variant else f"{stem}.spv"
    if src.exists():
        from ...shaders import build
        if name in build.stale(src):
            build.compile_all()
    path = SHADER_DIR / name
    if not path.exists():
        raise DeviceError(f"shader {name} is missing: reinstall vkspec (the build compiles shaders)")
    code = path.read_bytes()
    return Shader(stem, name, code, reflect(code))


def float_modes(info) -> list[str]:
    """The float modes the shaders declare on this device (vkinfo.DeviceInfo
    or None); VKSPEC_FLOAT_CONTROLS=0 declares none."""
    fc = info.float_controls if info is not None else None
    if fc is None or os.environ.get("VKSPEC_FLOAT_CONTROLS", "1") == "0":
        return []
    offered = {"SignedZeroInfNanPreserve": fc.signed_zero_inf_nan_preserve,
               "DenormPreserve": fc.denorm_preserve, "RoundingModeRTE": fc.rounding_rte}
    return [m for m in float_controls.MODES if offered[m]]


class Device:
    """One Vulkan device. Create one per process (kp.Manager is heavy).

    ``check=False`` skips the refusal on a failed probe (vkspec doctor reports
    it instead)."""

    def __init__(self, index: int | None = None, check: bool = True):
        from . import probe, vkinfo
        kp = self.kp = _import_kp()
        if index is None:
            index = int(os.environ.get("VKSPEC_DEVICE", "0"))
        self.index = index
        self.info = vkinfo.device(index)
        self.float_modes = float_modes(self.info)
        exts = [vkinfo.FLOAT_CONTROLS_EXT] if self.float_modes else []
        try:
            self.mgr = kp.Manager(index, [], exts)
        except Exception as e:
            raise DeviceError(f"no Vulkan device {index}: {e}") from None
        props = self.mgr.get_device_properties()
        self.name = props.get("device_name", "?")
        # (variant, src id, dst id) -> (algorithm, src, dst): the entry holds its
        # tensors, so an id cannot be reused by another tensor while cached
        self._fills: OrderedDict = OrderedDict()
        self._readback = None
        self._spirv: dict[str, bytes] = {}
        with device_calls("in the start-up probe"):
            self.probe = probe.run(self, load_shader("float_probe"))
        if check and not self.probe.ok:
            raise DeviceError(f"{self.name} does not compute float32 as vkspec's exact path needs: "
                              f"{self.probe.line()} (--fallback cpu runs on the CPU instead)")

    def spirv(self, shader: Shader) -> bytes:
        """The shader's SPIR-V with this device's float modes."""
        code = self._spirv.get(shader.name)
        if code is None:
            code = self._spirv[shader.name] = float_controls.add_modes(shader.spirv, self.float_modes)
        return code

    # --- tensors ---------------------------------------------------------
    @on_device("to make a tensor")
    def tensor(self, data: np.ndarray, kind: str = "device"):
        """A host-visible kp tensor (float32, uint32 or int32) holding ``data``:
        the buffers that cross every step (kp keeps a host copy of them)."""
        assert kind == "device", "storage tensors are made with storage() and filled through a stager"
        data = np.ascontiguousarray(data).ravel()
        if data.dtype not in (np.float32, np.uint32, np.int32):
            raise TypeError(f"unsupported tensor dtype {data.dtype}")
        if data.size == 0:
            data = np.zeros(1, dtype=data.dtype)
        t = self.mgr.tensor_t(data, self.kp.TensorTypes.device)
        self.upload(t)                 # kp fills only the host copy of a device tensor
        return t

    @on_device("to allocate device memory")
    def storage(self, n: int, dtype=np.uint32):
        """n words of device memory, contents undefined. kp wants an array to
        size the tensor by and ignores its contents for storage tensors: an
        empty one that is never touched costs no host memory."""
        dtype = np.float32 if np.dtype(dtype) == np.float32 else np.uint32
        return self.mgr.tensor_t(np.empty(max(int(n), 1), dtype=dtype), self.kp.TensorTypes.storage)

    @on_device("to allocate device memory")
    def zeros(self, n: int, dtype=np.float32, kind: str = "storage"):
        """A tensor of n zero words; storage tensors are zeroed on the device
        (no host staging of their size)."""
        t = self.mgr.tensor_t(np.zeros(max(int(n), 1), dtype=dtype), self.kp.TensorTypes.storage
                              if kind == "storage" else self.kp.TensorTypes.device)
        if kind == "storage":
            seq = self.sequence()
            self.record_fill(seq, None, t, max(int(n), 1))
            seq.eval()
        else:
            self.upload(t)
        return t

    def record_fill(self, seq, src, dst, n: int, src_off: int = 0, dst_off: int = 0):
        """Record a word copy src[src_off:+n] -> dst[dst_off:+n], or zeros when
        src is None. One algorithm per (src, dst) pair serves every n and
        offset (the shader strides over n), so moving memory builds no new
        pipelines after the first use."""
        variant = "zero" if src is None else "copy"
        key = (variant, id(src), id(dst))
        if key in self._fills:
            self._fills.move_to_end(key)
            algo = self._fills[key][0]
        else:
            size = dst.size() if src is None else min(src.size(), dst.size())
            groups = max(1, min(FILL_GROUPS, -(-size // 64)))
            algo = self.algorithm(load_shader("fill", variant), [dst if src is None else src, dst], groups,
                                  push_structs.Fill(n=0))
            self._fills[key] = (algo, src, dst)
            if len(self._fills) > FILL_CACHE:
                self._fills.popitem(last=False)
        seq.record(self.kp.OpAlgoDispatch(
            algo, load_shader("fill", variant).pack(push_structs.Fill(n=n, x_off=src_off, y_off=dst_off))))
        return algo

    def forget(self, t):
        """t is going: the fills bound to it go first."""
        for k in [k for k in self._fills if id(t) in k[1:]]:
            del self._fills[k]

    @on_device("to read device memory")
    def read(self, t, offset: int, n: int, dtype=np.float32) -> np.ndarray:
        """Words offset..offset+n of any tensor, through one host-visible
        readback buffer (READ_WORDS at a time)."""
        if self._readback is None:
            self._readback = self.mgr.tensor_t(np.zeros(READ_WORDS, np.uint32), self.kp.TensorTypes.device)
        out = np.empty(n, np.uint32)
        for at in range(0, n, READ_WORDS):
            m = min(READ_WORDS, n - at)
            seq = self.sequence()
            self.record_fill(seq, t, self._readback, m, src_off=offset + at)
            seq.record(self.kp.OpTensorSyncLocal([self._readback]))
            seq.eval()
            out[at:at + m] = self._readback.data()[:m]
        return out.view(np.dtype(dtype))

    # --- algorithms ------------------------------------------------------
    @on_device("to create a pipeline")
    def algorithm(self, shader: Shader, tensors, groups: int | tuple, push=None, spec=()):
        """A kp algorithm: ``tensors`` in binding order (as many as the shader
        declares), ``push`` the shader's push struct (None: it has none),
        ``spec`` its specialization constants (uint32, constant_id 0, 1, ..)."""
        bound = len(shader.reflection.buffers)
        if len(tensors) != bound:
            raise ValueError(f"{shader.name} binds {bound} buffers, got {len(tensors)}")
        wg = (groups, 1, 1) if isinstance(groups, int) else tuple(groups)
        words = shader.pack(push) if push is not None else np.zeros(0, dtype=np.uint32)
        return self.mgr.algorithm(list(tensors), self.spirv(shader), wg, np.asarray(spec, dtype=np.uint32), words)

    def sequence(self):
        return self.mgr.sequence()

    @on_device("in an upload")
    def upload(self, *tensors):
        self.mgr.sequence().eval(self.kp.OpTensorSyncDevice(list(tensors)))

    @on_device("in a download")
    def download(self, *tensors):
        self.mgr.sequence().eval(self.kp.OpTensorSyncLocal(list(tensors)))


_DEVICE: Device | None = None


def get_device() -> Device:
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = Device()
    return _DEVICE
