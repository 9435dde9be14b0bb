"""Run under a given validation-layer log (see test_sync_validation.py).

mode "chain": 24 dependent dispatches (rmsnorm -> gemv, 12 times) recorded in
one sequence and replayed twice; prints whether the result equals NumPy's.
mode "hazard": a dispatch, then a host upload into the buffer it wrote, with
no barrier between them (kp's OpTensorSyncDevice records none): a real
write-after-write hazard, the positive control for synchronization validation.
mode "generate": a full generation on the dense chain of a tiny hybrid with
an MTP head (prefill blocks, 48 decode steps, verify blocks with copy slots,
rewinds, the MTP head); prints whether every logits row equals the CPU's.
"""

import sys

import numpy as np

from vkspec import exact
from vkspec.backends.vulkan.device import get_device, load_shader
from vkspec.backends.vulkan.memory import Uploader
from vkspec.backends.vulkan.recorder import gemv_dispatch, gemv_layout
from vkspec.shaders import push as P
from vkspec.selftest import same_bits


def chain():
    dev = get_device()
    rng = np.random.default_rng(0)
    k = 256
    w = (rng.standard_normal((k, k)) * 0.1).astype(np.float32)
    norm_w = (1 + rng.standard_normal(k) * 0.1).astype(np.float32)
    x0 = rng.standard_normal(k).astype(np.float32)
    up = Uploader(dev)
    tw, tn, ts = up.array("w", w), up.array("norm", norm_w), up.zeros("scales", 1)
    ta, tb = dev.tensor(x0), dev.tensor(np.zeros(k, np.float32))
    rms = dev.algorithm(load_shader("rmsnorm", "plain"), [ta, tn, tb], 1,
                        P.Rmsnorm(rows=1, n=k, x_stride=k, y_stride=k, eps=1e-6, inv_n=np.float32(1 / k)))
    variant, groups = gemv_dispatch("f32", k, gemv_layout(dev))
    mv = dev.algorithm(load_shader("gemv", variant), [tw, ts, tb, ta], groups,
                       P.Gemv(rows=k, cols=k, nvec=1, x_stride=k, y_stride=k, row_bytes=4 * k))
    seq = dev.sequence()
    for _ in range(12):
        seq.record(dev.kp.OpAlgoDispatch(rms))
        seq.record(dev.kp.OpAlgoDispatch(mv))
    dev.upload(ta)
    seq.eval()
    seq.eval()                        # replay: no re-recording
    dev.download(ta)
    x = x0
    for _ in range(24):            # 12 pairs, replayed twice
        x = exact.gemv(w, exact.rmsnorm(x, norm_w, 1e-6))
    print("match" if same_bits(ta.data(), x) else "MISMATCH")


def hazard():
    dev = get_device()
    x = dev.tensor(np.ones(64, np.float32))
    y = dev.tensor(np.zeros(64, np.float32))
    algo = dev.algorithm(load_shader("core_eval"), [x, y], 1, P.CoreEval(n=64, op=0))
    seq = dev.sequence()
    seq.record(dev.kp.OpAlgoDispatch(algo))
    seq.record(dev.kp.OpTensorSyncDevice([y]))
    seq.eval()
    print("ran")


def generate():
    import tempfile
    from vkspec.loader import load_model
    from vkspec.tiny import make_tiny
    d = make_tiny(tempfile.mkdtemp(), seed=2, mtp=True)
    cpu, vk = load_model(d, fmt="int4-g64"), load_model(d, fmt="int4-g64", backend="vulkan")
    sc, sv = cpu.new_state(), vk.new_state()
    ok = True
    toks = [int(t) for t in np.random.default_rng(1).integers(1, 512, 21)]
    for i in range(0, 21, 8):
        ok &= same_bits(cpu.forward(toks[i:i + 8], sc)[1], vk.forward(toks[i:i + 8], sv)[1])
    tok = 1
    for step in range(48):
        block = [tok] + [(tok * 7 + j) % 512 for j in range(step % 4)]
        hc, lc = cpu.forward(block, sc, copies=True)
        hv, lv = vk.forward(block, sv, copies=True)
        ok &= same_bits(lc, lv)
        keep = 1 + step % len(block)
        cpu.rewind(sc, keep)
        vk.rewind(sv, keep)
        tok = int(np.argmax(lc[keep - 1]))
        pos = [sc.kv_len]
        ok &= same_bits(cpu.mtp_forward(hc[keep - 1:keep], [tok], sc, pos)[1],
                        vk.mtp_forward(hv[keep - 1:keep], [tok], sv, pos)[1])
    print("match" if ok else "MISMATCH")


if __name__ == "__main__":
    {"chain": chain, "hazard": hazard, "generate": generate}[sys.argv[1]]()
