"""The ``cluster`` fixture: hosts as network namespaces (tests/netns_cluster.py), torn down by
name and PID after the test, also when it fails; skipped with the reason where it cannot run."""
import pytest

from netns_cluster import Cluster, sweep


@pytest.fixture
def cluster():
    """``cluster(["trainer0", "rollout0"])`` builds a `Cluster`; all are closed after the test."""
    why = Cluster.unavailable()
    if why:
        pytest.skip(f"multi-host tests need network namespaces: {why}")
    sweep()  # what a killed earlier run left behind
    built: list[Cluster] = []

    def build(hosts, **kwargs) -> Cluster:
        built.append(Cluster(hosts, **kwargs))
        return built[-1]

    yield build
    for c in built:
        c.close()
