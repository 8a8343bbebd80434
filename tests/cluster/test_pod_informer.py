"""The operator's own pod informer against the real API server: paged list,
watch, the relist after 410 Gone (a version older than the apiserver keeps),
and the resume of a watch whose connection went silent."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from tests.fixtures.poll import async_wait_for
from torchfleet_operator import informer as informer_module
from torchfleet_operator import metrics
from torchfleet_operator.desired.labels import (
    JOB_NAME_LABEL,
    NODE_RANK_LABEL,
    RESTART_LABEL,
    ROLE_LABEL,
)
from torchfleet_operator.informer import PodInformer
from torchfleet_operator.kube import RawApi


def job_pod(name: str, job: str, rank: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                JOB_NAME_LABEL: job,
                ROLE_LABEL: "master" if rank == 0 else "worker",
                NODE_RANK_LABEL: str(rank),
                RESTART_LABEL: "0",
            },
        },
        # Nowhere to run: the pod stays Pending, which is all this test needs.
        "spec": {
            "nodeSelector": {"torchfleet.dev/no-such-node": "true"},
            "containers": [{"name": "trainer", "image": "busybox"}],
        },
    }


def names(informer: PodInformer, key: tuple[str, str]) -> set[str]:
    return {p.name for p in informer.index.get(key) or ()}


def _forgets_version_1(raw: RawApi, path: str) -> bool:
    """Whether a watch from version 1 gets 410 Gone here (asked with a 2 s timeout)."""
    query = {"watch": "true", "resourceVersion": "1", "timeoutSeconds": "2"}
    for lines in raw.stream(path, query, stop=threading.Event()):
        for line in lines:
            event = json.loads(line)
            if event.get("type") == "ERROR":
                return bool((event.get("object") or {}).get("code") == 410)
    return False


def test_paged_list_then_watch_keep_the_index_and_wake_each_job(cluster, namespace, monkeypatch):
    raw = RawApi(cluster.api_client(), counted=False)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for rank in range(5):  # listed two per page: three pages
        raw.request("POST", pods, job_pod(f"llm-{rank}", "llm", rank))
    monkeypatch.setattr(informer_module, "LIST_PAGE", 2)
    woken: list[tuple[str, str]] = []

    async def scenario() -> None:
        informer = PodInformer(raw, [namespace], woken.append)
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            assert names(informer, (namespace, "llm")) == {f"llm-{r}" for r in range(5)}
            raw.request("POST", pods, job_pod("other-0", "other", 0))
            raw.request("DELETE", f"{pods}/llm-4", query={"gracePeriodSeconds": 0})
            await async_wait_for(
                "the new job's pod", lambda: (namespace, "other") in informer.index
            )
            await async_wait_for(
                "the deleted pod gone", lambda: "llm-4" not in names(informer, (namespace, "llm"))
            )
        finally:
            informer.stop()

    asyncio.run(scenario())
    assert (namespace, "other") in woken and (namespace, "llm") in woken


def test_a_watch_from_a_version_the_apiserver_no_longer_keeps_relists(cluster, namespace):
    """410 Gone ends the watch with None (relist), and the relist drops what was
    deleted while nobody watched."""
    raw = RawApi(cluster.api_client(), counted=False)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for rank in range(2):
        raw.request("POST", pods, job_pod(f"llm-{rank}", "llm", rank))
    # A watch cache that began at revision 1 would replay instead; the local
    # cluster starts past it (localcluster.py's _age_etcd), as any cluster is.
    assert _forgets_version_1(raw, pods), (
        "this API server still serves a watch from version 1 (its watch cache began at "
        "revision 1), so no 410 Gone can be provoked here"
    )
    expired = metrics.WATCH_RESTARTS.labels(resource="pods", reason="expired")

    async def scenario() -> None:
        informer = PodInformer(raw, [namespace], lambda _key: None)
        informer._loop = asyncio.get_running_loop()
        ((_, in_scope),) = informer_module.scopes([namespace])
        await asyncio.to_thread(informer._list, pods, in_scope)
        await async_wait_for(
            "the listed pods", lambda: len(names(informer, (namespace, "llm"))) == 2
        )
        raw.request("DELETE", f"{pods}/llm-1", query={"gracePeriodSeconds": 0})
        before = expired._value.get()
        # Version 1 predates the apiserver's watch cache: it answers 410.
        assert await asyncio.to_thread(informer._watch, pods, "1", in_scope) is None
        assert expired._value.get() == before + 1
        await asyncio.to_thread(informer._list, pods, in_scope)
        await async_wait_for(
            "the relisted index", lambda: names(informer, (namespace, "llm")) == {"llm-0"}
        )
        informer.stop()

    asyncio.run(scenario())


class FreezableRelay:
    """A TCP relay to the API server whose open connections can be frozen:
    nothing flows either way any more, yet nothing closes, as when a link
    drops without a FIN (or the apiserver orphans a watch). Connections made
    after the freeze relay as usual."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.frozen: set[int] = set()
        self.open: set[int] = set()
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen |= self.open

    def close(self) -> None:
        self.stopped.set()
        for sock in self.sockets:
            sock.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            self.open.add(id(client))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(id(client), source, sink), daemon=True
                ).start()

    def _pump(self, connection: int, source: socket.socket, sink: socket.socket) -> None:
        while not self.stopped.is_set():
            try:
                if not select.select([source], [], [], 0.1)[0]:
                    continue
                data = source.recv(65536)
                if connection in self.frozen:  # what came after the freeze never arrives
                    if not data:
                        self.stopped.wait()
                    continue
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return


@contextmanager
def relayed(api: Any) -> Iterator[tuple[FreezableRelay, Any]]:
    """A relay to ``api``'s server and a client of the same identity through it."""
    server = urlsplit(api.configuration.host)
    relay = FreezableRelay((server.hostname or "127.0.0.1", server.port or 443))
    try:
        configuration = api.configuration
        configuration.host = f"https://127.0.0.1:{relay.port}"
        yield relay, type(api)(configuration)
    finally:
        relay.close()


def test_a_watch_gone_silent_is_resumed_and_misses_nothing(cluster, namespace, monkeypatch):
    """A watch that stops hearing even the apiserver's minutely bookmark is
    dead: the informer resumes it (from the last version seen, so an event of
    the silent spell is not lost) instead of waiting for the watch's own end,
    minutes away, with a stale index meanwhile."""
    monkeypatch.setattr(informer_module, "INACTIVE_SECONDS", 2.0)
    direct = RawApi(cluster.api_client(), counted=False)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    direct.request("POST", pods, job_pod("before-0", "before", 0))
    inactive = metrics.WATCH_RESTARTS.labels(resource="pods", reason="inactive")

    async def scenario(relay: FreezableRelay, raw: RawApi) -> None:
        informer = PodInformer(raw, [namespace], lambda _key: None)
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            assert names(informer, (namespace, "before")) == {"before-0"}
            # A pod seen through the watch: it streams on a connection open now.
            direct.request("POST", pods, job_pod("before-1", "before", 1))
            await async_wait_for(
                "the watched pod", lambda: "before-1" in names(informer, (namespace, "before"))
            )
            before = inactive._value.get()
            relay.freeze()  # the watch's connection: open, and silent
            direct.request("POST", pods, job_pod("during-0", "during", 0))
            await async_wait_for(
                "the pod made while the watch was silent",
                lambda: (namespace, "during") in informer.index,
                timeout=30,
            )
            assert inactive._value.get() > before
        finally:
            informer.stop()

    with relayed(cluster.api_client()) as (relay, api):
        asyncio.run(scenario(relay, RawApi(api, counted=False)))
