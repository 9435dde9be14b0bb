"""The Vulkan device through Kompute (kp): shaders, tensors, push constants.

Everything vkspec asks of kp goes through here, so kp 0.9.0's quirks are
handled once:

* kp takes the push-constant dtype from the spec-constant array's dtype, so
  every algorithm gets empty uint32 spec constants and uint32 push constants;
  :meth:`Shader.pack` writes a shader's push struct (vkspec/shaders/push.py,
  checked against the SPIR-V at build time) into those words.
* The patched kp (ci/kompute) records a global barrier before every dispatch
  and copy, so a recorded sequence of dependent dispatches is hazard-free.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...shaders import push as push_structs
from ...shaders.spirv import Reflection, reflect

SHADER_DIR = Path(__file__).resolve().parents[2] / "shaders"
FILL_GROUPS = 1024          # workgroups of a fill; each invocation strides over the words
READ_WORDS = 1 << 18        # the readback buffer (1 MiB)
FILL_CACHE = 256            # fill algorithms kept (the chain's arenas need a few dozen)


class DeviceError(RuntimeError):
    """A device that cannot run vkspec's exact path, or a failed device call."""


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


class Device:
    """One Vulkan device. Create one per process (kp.Manager is heavy)."""

    def __init__(self, index: int | None = None):
        kp = self.kp = _import_kp()
        if index is None:
            index = int(os.environ.get("VKSPEC_DEVICE", "0"))
        try:
            self.mgr = kp.Manager(index)
        except Exception as e:
            raise DeviceError(f"no Vulkan device {index}: {e}") from None
        props = self.mgr.get_device_properties()
        self.name = props.get("device_name", "?")
        # (variant, src id, dst id) -> (algorithm, src, dst): the entry holds its
        # tensors, so an id cannot be reused by another tensor while cached
        self._fills: OrderedDict = OrderedDict()
        self._readback = None
        self.denormals = probe_denormals(self)
        if self.denormals != "preserve":
            raise DeviceError(
                f"{self.name} flushes float32 denormals ({self.denormals}); vkspec's exact "
                "path needs IEEE gradual underflow, as NumPy computes it")

    # --- tensors ---------------------------------------------------------
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

    def storage(self, n: int, dtype=np.uint32):
        """n words of device memory, contents undefined. kp wants an array to
        size the tensor by and ignores its contents for storage tensors: an
        empty one that is never touched costs no host memory."""
        dtype = np.float32 if np.dtype(dtype) == np.float32 else np.uint32
        return self.mgr.tensor_t(np.empty(max(int(n), 1), dtype=dtype), self.kp.TensorTypes.storage)

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
    def algorithm(self, shader: Shader, tensors, groups: int | tuple, push=None):
        """A kp algorithm: ``tensors`` in binding order (as many as the shader
        declares), ``push`` the shader's push struct (None: it has none)."""
        bound = len(shader.reflection.buffers)
        if len(tensors) != bound:
            raise ValueError(f"{shader.name} binds {bound} buffers, got {len(tensors)}")
        wg = (groups, 1, 1) if isinstance(groups, int) else tuple(groups)
        words = shader.pack(push) if push is not None else np.zeros(0, dtype=np.uint32)
        return self.mgr.algorithm(list(tensors), shader.spirv, wg, np.zeros(0, dtype=np.uint32), words)

    def sequence(self):
        return self.mgr.sequence()

    def upload(self, *tensors):
        self.mgr.sequence().eval(self.kp.OpTensorSyncDevice(list(tensors)))

    def download(self, *tensors):
        self.mgr.sequence().eval(self.kp.OpTensorSyncLocal(list(tensors)))


def probe_denormals(dev: "Device") -> str:
    """'preserve' when the device computes float32 denormals as IEEE 754 does.

    Runs x * y (a denormal product), d + 0 and d * 2**30 for a denormal d.
    """
    a = np.array([1e-20, 1e-20, 1e-40, 0.0, 2.0 ** 30], dtype=np.float32)
    want = np.array([a[0] * a[1], a[2] + a[3], a[2] * a[4]], dtype=np.float32)
    shader = load_shader("denormal_probe")
    ta, to = dev.tensor(a), dev.tensor(np.zeros(3, np.float32))
    algo = dev.algorithm(shader, [ta, to], 1)
    dev.mgr.sequence().record(dev.kp.OpTensorSyncDevice([ta, to])) \
        .record(dev.kp.OpAlgoDispatch(algo)).record(dev.kp.OpTensorSyncLocal([to])).eval()
    got = to.data().copy()
    if got.view(np.uint32).tolist() == want.view(np.uint32).tolist():
        return "preserve"
    return "flush-to-zero" if got[0] == 0 else f"unknown ({got.tolist()})"


_DEVICE: Device | None = None


def get_device() -> Device:
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = Device()
    return _DEVICE
