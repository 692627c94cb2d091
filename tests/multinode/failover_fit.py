"""tests/scripts/distributed_fit.py with running servers and short timeouts (``$REQUEST_TIMEOUT`` s
for a completion, ``$CONTROL_TIMEOUT`` s, default 120, for a weight reload): a server whose host
drops off the network mid-run costs at most that long before its requests go to the others
(test_multinode_rollout_faults.py). Writes ``syncs.json``: each weight sync's bytes, seconds and
live servers.

    REQUEST_TIMEOUT=20 CONTROL_TIMEOUT=40 python tests/multinode/failover_fit.py --strategy single --out DIR \\
        --engine server --server-urls http://A:8000,http://B:8000
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import distributed_fit as fit  # noqa: E402


class SyncRecorder(fit.RLCallback):
    """Each weight sync's ``last_sync`` (bytes, seconds) and the servers left, at the end to syncs.json."""

    def __init__(self, out: str):
        self.out, self.syncs = out, []

    def on_train_batch_end(self, trainer, module, *args):
        engine = module.rollout_engine
        self.syncs.append({**engine.last_sync, "live_servers": len(engine.pool.live)})

    def on_train_end(self, trainer, module):
        with open(os.path.join(self.out, "syncs.json"), "w") as f:
            json.dump(self.syncs, f)


def engine_callbacks(engine: str, out: str, urls: str | None = None) -> list:
    from lightning_rlpt.callbacks import VLLMServerRollout
    servers = VLLMServerRollout(urls=urls.split(","), request_timeout=float(os.environ["REQUEST_TIMEOUT"]),
                                control_timeout=float(os.environ.get("CONTROL_TIMEOUT", "120")), warn_after=5)
    return [servers, fit.ServerRecorder(), fit.ServedWeights(out), SyncRecorder(out)]


if __name__ == "__main__":
    fit.engine_callbacks = engine_callbacks
    fit.main()
