"""Every trainer rank must reach every vLLM server: checked at start, the same error on all ranks.

Under DDP each rank samples its own rows from every server, so a server that one node can reach
and another cannot (a firewall, a missing route, a server bound to an address only its own
network sees, ``launch=`` servers on rank 0's loopback seen from another node) would fail on
that rank alone while the others wait for it in a collective until the process-group timeout.
`check_reachable` probes each URL's ``/health`` from each rank with a short timeout, gathers
every rank's view, and raises on every rank one error naming each unreachable URL and the ranks
(with their hosts) that cannot reach it.

Examples:
    >>> check_reachable(["http://10.0.0.7:8000"], timeout=10)  # doctest: +SKIP
"""
from __future__ import annotations

import socket

import torch.distributed as dist

from ...http_client import HTTPFailure, exchange

from ..ranks import world


class UnreachableServer(ConnectionError):
    """A vLLM server that some trainer rank cannot reach."""


def probe(urls: list[str], timeout: float) -> dict[str, str]:
    """``{url: reason}`` for each URL whose ``/health`` does not answer 200 from this process."""
    failed = {}
    for url in urls:
        try:
            status = exchange("GET", url.rstrip("/") + "/health", timeout=timeout, connect_timeout=timeout).status
            if status != 200:
                failed[url] = f"/health answered HTTP {status}"
        except HTTPFailure as err:
            failed[url] = str(err)
    return failed


def check_reachable(urls: list[str], timeout: float = 10.0, local_problem: str | None = None) -> None:
    """Raise `UnreachableServer` on every rank when any rank cannot reach any of ``urls``, and
    ``ValueError`` on every rank when any rank has a ``local_problem`` (e.g. a snapshot directory
    its host cannot write, `SnapshotTransport.problem`).

    Args:
        urls: the servers' base URLs (``http://host:port``), the same list on every rank.
        timeout: seconds each probe may take (connect and answer).
        local_problem: what this rank cannot do, gathered with the probes.
    """
    rank, size = world()
    mine = (socket.gethostname(), probe(urls, timeout), local_problem)
    views: list = [mine]
    if size > 1:
        views = [None] * size
        dist.all_gather_object(views, mine)  # every rank learns every rank's view: all raise alike
    problems = []
    for url in urls:
        cut = [(r, host, failed[url]) for r, (host, failed, _) in enumerate(views) if url in failed]
        if cut:
            who = "; ".join(f"rank {r} (host {host}): {reason}" for r, host, reason in cut)
            reach = [r for r, (_, failed, _) in enumerate(views) if url not in failed]
            problems.append(f"vLLM server {url} cannot be reached from trainer {who}"
                            + (f" (ranks {reach} reach it)" if reach else ""))
    local = [f"rank {r} (host {host}): {problem}" for r, (host, _, problem) in enumerate(views) if problem]
    if local:
        raise ValueError("; ".join(local))
    if problems:
        raise UnreachableServer(
            "; ".join(problems) + ". Every trainer rank samples from every server: make each server's address "
            "reachable from every trainer node (start it with --host on an address the trainer nodes route to; "
            "check firewalls and routes), or list only servers every node reaches")
