"""The core's error against float64, in ULP of the float32 result."""

import numpy as np
import pytest

from vkspec import exact


def max_ulp(got, ref):
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    ok = np.isfinite(ref32) & (np.abs(ref) < 3.4e38)
    spacing = np.spacing(np.abs(ref32[ok])).astype(np.float64)
    return float(np.max(np.abs(got[ok].astype(np.float64) - ref[ok]) / spacing))


X_EXP = np.linspace(-103.0, 88.7, 1_000_001, dtype=np.float32)
X_POS = np.exp(np.linspace(-103.0, 88.0, 1_000_001)).astype(np.float32)
X_MID = np.linspace(-30.0, 30.0, 1_000_001, dtype=np.float32)
X_LOG1P = np.concatenate([np.linspace(-0.999, 10.0, 500_001, dtype=np.float32),
                          np.exp(np.linspace(-40, 0, 500_001)).astype(np.float32)])

CASES = {
    "exp": (exact.exp, np.exp, X_EXP, 2.0),
    "log": (exact.log, np.log, X_POS, 2.0),
    "recip": (exact.recip, lambda x: 1.0 / x, X_POS, 2.0),
    "rsqrt": (exact.rsqrt, lambda x: 1.0 / np.sqrt(x), X_POS, 2.0),
    "sigmoid": (exact.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x)), X_MID, 3.0),
    "silu": (exact.silu, lambda x: x / (1.0 + np.exp(-x)), X_MID, 4.0),
    "softplus": (exact.softplus, lambda x: np.where(x > 20, x, np.log1p(np.exp(x))), X_MID, 4.0),
    "log1p": (exact.log1p, np.log1p, X_LOG1P, 4.0),
}


@pytest.mark.parametrize("name", CASES)
def test_ulp_bound(name):
    f, ref, x, bound = CASES[name]
    err = max_ulp(f(x), ref(x.astype(np.float64)))
    print(f"\n{name}: max {err:.3f} ULP over [{x.min():.4g}, {x.max():.4g}]")
    assert err <= bound


def test_exp_gradual_underflow_is_correctly_rounded_enough():
    x = np.linspace(-103.0, -87.4, 10001, dtype=np.float32)
    got = exact.exp(x).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - ref)) <= 2 * 2.0 ** -149
