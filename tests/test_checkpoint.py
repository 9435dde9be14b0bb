"""Checkpoint loading: source dtypes widen exactly; config spellings."""

import json

import numpy as np
import pytest

from vkspec.checkpoint import Checkpoint
from vkspec.config import from_dict
from vkspec.tiny import tiny_config

from conftest import require  # noqa: E402

torch = require("torch")
pytestmark = pytest.mark.oracle
from safetensors.torch import save_file  # noqa: E402


def test_bf16_f16_fp8_widen_exactly(tmp_path):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 300, generator=g)
    scale = torch.rand(2, 3, generator=g) * 0.01 + 0.001       # 128x128 blocks
    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    q8 = (w / full).to(torch.float8_e4m3fn)
    save_file({"a.weight": w.to(torch.bfloat16), "b.weight": w.to(torch.float16),
               "c.weight": q8, "c.weight_scale_inv": scale}, str(tmp_path / "m.safetensors"))
    ck = Checkpoint(tmp_path)
    assert np.array_equal(ck.get("a.weight"), w.to(torch.bfloat16).float().numpy())
    assert np.array_equal(ck.get("b.weight"), w.to(torch.float16).float().numpy())
    want = (q8.float() * full).numpy()
    assert ck.get("c.weight").tobytes() == want.tobytes()


def test_config_spellings():
    base = tiny_config()
    a = dict(base)
    a.pop("rope_parameters"), a.pop("dtype"), a.pop("partial_rotary_factor")
    a["rope_theta"], a["torch_dtype"] = 5e5, "bfloat16"
    b = dict(base)
    b["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.25}
    b["dtype"] = "bfloat16"
    ca, cb = from_dict(a), from_dict(b)
    assert ca.rope_theta == cb.rope_theta == 5e5 and ca.dtype == cb.dtype == "bfloat16"
    assert ca.layer_types == ["linear_attention"] * 3 + ["full_attention"]
