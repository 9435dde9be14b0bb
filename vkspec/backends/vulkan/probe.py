"""The start-up probe: the device computes vkspec/ieee.py's cases (rounding
ties, denormals in and out, -0, inf and NaN, min/max, comparisons) with the
shaders' own float modes, and each answer is compared with the exact one,
which NumPy gives too (backends/cpu/fpenv.py checks that side).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ... import ieee


@dataclass
class ProbeResult:
    cases: int
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # the reported-only cases (min/max with a NaN)

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        if self.ok:
            nan = [n.endswith("NaN") for n in self.notes]
            how = "the NaN" if all(nan) else "the number" if not any(nan) else "; ".join(self.notes)
            return (f"{self.cases} cases as IEEE 754; min/max with a NaN give {how} "
                    "(undefined in GLSL, NumPy gives the NaN: no shader uses that result)")
        more = f" (and {len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        return f"{self.failures[0]}{more}"


def case_words(cases=ieee.CASES) -> np.ndarray:
    """(op, a, b, c) bits per case, as float_probe.comp reads them."""
    return np.array([[ieee.OPS.index(c.op), c.a, c.b, c.c] for c in cases], dtype=np.uint32)


def run(dev, shader, cases=ieee.CASES) -> ProbeResult:
    """Every case on the device (device.Device) with float_probe.comp
    (``shader``, as device.load_shader gives it), one workgroup each."""
    words = case_words(cases)
    tc, to = dev.tensor(words.ravel()), dev.tensor(np.zeros(len(cases), np.uint32))
    algo = dev.algorithm(shader, [tc, to], len(cases))
    kp = dev.kp
    dev.mgr.sequence().record(kp.OpTensorSyncDevice([tc, to])).record(kp.OpAlgoDispatch(algo)) \
        .record(kp.OpTensorSyncLocal([to])).eval()
    got = [int(x) for x in to.data().copy()]
    fails, notes = ieee.check(got, cases)
    return ProbeResult(len(cases), fails, notes)
