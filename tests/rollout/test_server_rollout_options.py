"""`VLLMServerRollout(connect_timeout=...)`: the bound on opening a connection (a host whose link is
down sends no refusal) is the user's to set, refused when not positive, and reaches the engine's
server pool, checked against a real HTTP server on loopback that answers the model listing."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import RLModule
from lightning_rlpt.callbacks import VLLMServerRollout
from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine


class Models(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"data": [{"id": "served"}]}).encode()
        self.send_response(200 if self.path in ("/v1/models", "/health") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def models_url():
    server = HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("value", [0, -1.0])
def test_a_connect_timeout_that_is_not_positive_is_refused_at_construction(value):
    with pytest.raises(ValueError, match=rf"connect_timeout must be > 0 seconds \(got {value}\)"):
        VLLMServerRollout(urls=["http://127.0.0.1:9"], connect_timeout=value)


def test_the_connect_timeout_reaches_the_engines_server_pool(models_url, warm_start_dir):
    """The callback's own setup builds the engine: it is installed, then refused by the model
    check (this server names no max_model_len); the pool it built carries the timeouts."""
    callback = VLLMServerRollout(urls=[models_url], connect_timeout=2.5, request_timeout=30.0)
    module = RLModule(warm_start_dir, reward_funcs=[task.exact_answer])
    trainer = quiet_trainer(max_steps=1, callbacks=[callback])
    try:
        with pytest.raises(ValueError, match="has max_model_len=None"):
            callback.setup(trainer, module, "fit")
        engine = callback.engine
        assert isinstance(engine, RemoteVLLMEngine) and engine.pool.model == "served"
        assert engine.pool.connect_timeout == 2.5  # every exchange of the pool opens its connections within it
    finally:
        callback.teardown(trainer, module, "fit")
    assert callback.engine is None and module.rollout_engine is None
