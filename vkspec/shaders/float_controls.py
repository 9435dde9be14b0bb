"""SPV_KHR_float_controls for every shader: the 32-bit execution modes
SignedZeroInfNanPreserve, DenormPreserve and RoundingModeRTE, added to a
compiled module when the device offers them.

Why the modes: without them a driver may treat float32 as fast-math (assume
no NaN, inf or -0, flush denormals, round as it likes); vkspec's contract is
IEEE 754 binary32 with round-to-nearest-even and gradual underflow, as NumPy
computes it. Declaring a mode the device does not offer is invalid, so which
modes go in is a property of the device (backends/vulkan/vkinfo.py), not of
the source.

Why a patch of the SPIR-V and not GLSL (GL_EXT_spirv_intrinsics'
spirv_execution_mode): each device wants its own subset (Lavapipe offers
SignedZeroInfNanPreserve and RTE but not DenormPreserve), so GLSL would need
up to eight builds of every variant (gemv alone has 48). The modes are three
instructions per mode in fixed places of the module's layout (capabilities,
extensions, execution modes: SPIR-V spec 2.4), so one build serves every
device, the build hook and its push check stay as they are, and
``tests/test_float_controls.py`` runs spirv-val on every patched shader.

Standard library only, like spirv.py.
"""

from __future__ import annotations

import struct

OP_EXTENSION, OP_CAPABILITY, OP_ENTRY_POINT, OP_EXECUTION_MODE = 10, 17, 15, 16
EXTENSION = "SPV_KHR_float_controls"
# mode name -> (execution mode, capability), SPIR-V 1.4 / SPV_KHR_float_controls
MODES = {
    "DenormPreserve": (4459, 4464),
    "SignedZeroInfNanPreserve": (4461, 4466),
    "RoundingModeRTE": (4462, 4467),
}
WIDTH = 32


def _inst(op: int, operands: list[int]) -> list[int]:
    return [((len(operands) + 1) << 16) | op] + operands


def _string(s: str) -> list[int]:
    raw = s.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def add_modes(spirv: bytes, modes) -> bytes:
    """The module with these 32-bit float modes (names of MODES) declared for
    every entry point; the module itself when ``modes`` is empty."""
    modes = [m for m in MODES if m in set(modes)]
    if not modes:
        return spirv
    words = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    i, last_cap, entries, last_mode, caps, exts = 5, None, [], None, set(), set()
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise ValueError("malformed SPIR-V instruction")
        if op == OP_CAPABILITY:
            last_cap = i + count
            caps.add(words[i + 1])
        elif op == OP_EXTENSION:
            exts.add(struct.pack(f"<{count - 1}I", *words[i + 1:i + count]).split(b"\0", 1)[0].decode())
        elif op == OP_ENTRY_POINT:
            entries.append(words[i + 2])
            last_mode = i + count
        elif op == OP_EXECUTION_MODE:
            last_mode = i + count
        i += count
    if last_cap is None or not entries:
        raise ValueError("not a shader module (no capability or entry point)")
    for_modes = [w for e in entries for m in modes for w in _inst(OP_EXECUTION_MODE, [e, MODES[m][0], WIDTH])]
    head = [w for m in modes if MODES[m][1] not in caps for w in _inst(OP_CAPABILITY, [MODES[m][1]])]
    if EXTENSION not in exts:
        head += _inst(OP_EXTENSION, _string(EXTENSION))
    out = words[:last_cap] + head + words[last_cap:last_mode] + for_modes + words[last_mode:]
    return struct.pack(f"<{len(out)}I", *out)


def declared(spirv: bytes) -> set[str]:
    """The float modes a module declares for 32-bit floats."""
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    by_mode = {v[0]: k for k, v in MODES.items()}
    out, i = set(), 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if op == OP_EXECUTION_MODE and count == 4 and words[i + 2] in by_mode and words[i + 3] == WIDTH:
            out.add(by_mode[words[i + 2]])
        i += max(count, 1)
    return out
