"""Exact speculative decoding.

Terms (used across this package):
* **pick**: a token the sampler chooses from exact logits; it is emitted.
* **draft**: a token a draft source proposes after the last pick. A draft is
  never emitted as such and never reaches the sampler; it only decides which
  rows one forward computes.
* **verify**: one forward over the last pick and its k drafts (k + 1 rows).
  Row j's logits are the ones a plain step would give after draft j.
* **settle**: the next picks are made from the verify's rows one at a time; a
  pick equal to draft j+1 accepts it and moves to the next row; the first
  pick that differs (the correction), or the pick from the last row (the
  bonus), ends the round. Every round emits exactly one such pick.
* **commit**: the rows that stood (the pick and the accepted drafts) stay in
  the model's state; the others are undone (KV watermark down, the recurrent
  state from the copy slot of the last standing row).
* **replay**: with fewer copy slots than drafts (S < K), a rejection past the
  slots re-runs the standing rows from the state before the verify.

Files: ``round.py`` is the transaction, one round as named steps;
``decode.py`` the loop around it (plain decoding is the same loop with no
draft source); ``prefill.py`` feeds a prompt; ``source.py`` is what a draft source offers;
``lookup.py`` and ``mtp.py`` are the draft sources; ``gate.py`` decides how
many drafts pay; ``vocab.py`` keeps the MTP head's draft vocabulary;
``forced.py`` holds the forced draft modes the tests use; ``config.py`` the
settings; ``sources.py`` builds the sources a mode means; ``result.py`` what a
run returns.
"""

from .config import SpecConfig  # noqa: F401
from .decode import generate, generate_spec  # noqa: F401
from .result import Result  # noqa: F401
