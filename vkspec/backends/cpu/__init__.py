"""The NumPy backend: the executable definition (ops.py), its compiled twins
(jit*.py) and the reference model (model.py)."""
