"""The NumPy backend: the executable definition (ops.py), its compiled twins
(jit*.py, which import numba_cache before numba) and the reference model
(model.py)."""
