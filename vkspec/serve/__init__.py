"""`vkspec serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn).

* ``engine.py``: one model and its state, turns run one at a time (states
  never mix), sessions (prefix reuse of saved states, pins), cancellation.
* ``text.py``: chat templates, incremental detokenisation, stop strings.
* ``app.py``: the app: the Guard, OpenAI-style errors, the routes' modules
  (``routes_*.py``, ``utility.py``) and what they share (``server.py``).
"""
