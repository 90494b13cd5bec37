"""``dice serve``: an OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn).

``app`` (routes), ``api`` (request bodies, OpenAI-shaped errors), ``batcher`` (the model thread and its
batches), ``text`` (a choice's text: stop strings, what a stream may send), ``metrics`` (Prometheus),
``launch`` (sockets, uvicorn, a server in a thread for tests and benchmarks).
"""

from dice.serving.app import DiceServer, ServeConfig
from dice.serving.launch import RunningServer, start_in_thread

__all__ = ["DiceServer", "RunningServer", "ServeConfig", "start_in_thread"]
