"""vLLM as a rollout engine: the in-process engine (``engine``) and its pre-start checks
(``checks``). Importing this package does not import vLLM; starting an engine does."""
