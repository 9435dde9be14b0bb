"""The adaptive expert tier: which routed experts live on the device.

* ``history.py``: per-layer usage counts of routed experts (every routed row,
  verify rows included), saved beside the model and loaded.
* ``policy.py``: the placement policy: a budget in slots, balanced across
  layers, admission and eviction by count with a rate limit on uploads.
* ``resident.py``: the device side: each MoE layer's expert slots, the map
  expert -> slot the shaders read, uploads, and the CPU path for experts that
  are not resident (or streaming them through the device instead).

Placement never changes output: an expert computes the same bits on the
device and on the CPU, and the routed results are combined in routing order
whichever side made them.
"""
