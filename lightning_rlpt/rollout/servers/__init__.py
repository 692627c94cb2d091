"""Completion servers any engine can use: `ServerPool` (``pool.py``: rows spread over
OpenAI-compatible ``/v1/completions`` endpoints, with timeouts and failover) and `free_port`
(``ports.py``: a loopback port for a server the run starts). What is vLLM's own (launching
``vllm serve``, weight transports, version checks) is in ``rollout/vllm/``."""
from .pool import ServerFailure, ServerPool
from .ports import free_port

__all__ = ["ServerFailure", "ServerPool", "free_port"]
