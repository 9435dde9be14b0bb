"""The compiled router and experts' combine (backends/cpu/jit_route.py)
against the NumPy definitions in ops (VKSPEC_CPU_JIT=0's path), bit for bit:
random rows, ties, non-finite logits, every k with and without the
renormalisation, and a shared expert or none."""

import numpy as np
import pytest

from conftest import same_bits

from vkspec.backends.cpu import jit, ops


def definition(monkeypatch, f, *args):
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        return f(*args)


def router_rows(rng, E):
    rows = [rng.normal(0, 3, E).astype(np.float32) for _ in range(6)]
    tie = np.zeros(E, np.float32)                  # every expert equal: ties go to the lower index
    tie[[1, 3, 6]] = 2.5
    big = rng.normal(0, 1, E).astype(np.float32)
    big[[1, 4]] = 1e30, np.inf                     # exp of inf - inf: NaN where it is the max
    nan = rng.normal(0, 1, E).astype(np.float32)
    nan[5] = np.nan
    low = np.full(E, -np.inf, np.float32)
    low[2] = 0.0
    tiny = (rng.normal(0, 1, E) * 1e-40).astype(np.float32)   # subnormal logits
    return np.stack(rows + [np.zeros(E, np.float32), tie, big, nan, low, tiny])


@pytest.mark.parametrize("E", [8, 60, 256])
@pytest.mark.parametrize("normalize", [False, True])
def test_route_is_the_definition(E, normalize, monkeypatch):
    x = router_rows(np.random.default_rng(E), E)
    for k in sorted({1, 2, 4, 8, E // 2, E}):
        idx, wt = ops.route(x, k, normalize)
        want_idx, want_wt = definition(monkeypatch, ops.route, x, k, normalize)
        assert np.array_equal(idx, want_idx), (k, idx, want_idx)
        assert same_bits(wt, want_wt), k
        one_idx, one_wt = ops.route(x[3:4], k, normalize)      # a row alone: its own bits
        assert np.array_equal(one_idx, idx[3:4]) and same_bits(one_wt, wt[3:4])


def test_route_can_fail_its_test(monkeypatch):
    """A top-k that broke ties to the higher index would be caught."""
    x = router_rows(np.random.default_rng(1), 16)
    idx, _ = ops.route(x[:, ::-1], 4, True)
    want, _ = definition(monkeypatch, ops.route, x, 4, True)
    assert not np.array_equal(15 - idx, want)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("n, k", [(1, 8), (3, 2), (5, 1)])
def test_moe_combine_is_the_definition(n, k, shared, monkeypatch):
    rng = np.random.default_rng(n * 10 + k)
    H = 72
    x = rng.normal(0, 1, (n, H)).astype(np.float32)
    ys = rng.normal(0, 1, (n, k, H)).astype(np.float32)
    ys[0, 0, :4] = [np.inf, -0.0, 1e-42, np.nan]
    wts = rng.random((n, k)).astype(np.float32)
    sh = rng.normal(0, 1, (n, H)).astype(np.float32) if shared else None
    logit = rng.normal(0, 2, n).astype(np.float32) if shared else None
    got = ops.moe_combine(x, ys, wts, sh, logit)
    want = definition(monkeypatch, ops.moe_combine, x, ys, wts, sh, logit)
    assert same_bits(got, want)
    swapped = ops.moe_combine(x, ys[:, ::-1], wts[:, ::-1], sh, logit)   # another order of the k terms
    assert k <= 2 or not same_bits(swapped, want)     # two terms add the same either way
