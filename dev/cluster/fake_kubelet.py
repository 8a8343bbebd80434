"""The one kubelet duty KWOK does wrong for us: confirming a pod's deletion.

A real kubelet, once a terminating pod's containers have stopped, deletes it
with grace period 0 *and the pod's UID as a precondition* (kubernetes#25224),
so a late confirmation can never remove a new pod that took the same name.
KWOK 0.8's delete step (the newest the module proxy serves) deletes by name
alone, and its stage queue can run that step twice, the second time after the
name is reused: measured here, 1 new incarnation in 60 deleted under load.
The operator names pods by rank and reuses the names in every gang, so a
test then saw a new gang's pod vanish and the gang restart once more.

So this process confirms deletions for KWOK's fake nodes: it watches bound
pods and, for each one terminating on a node annotated
``kwok.x-k8s.io/node=fake``, clears its finalizers and deletes it, both
guarded by its UID. A pod labelled ``torchfleet.dev/kwok-dead-kubelet=true``
is left alone: its kubelet is dead (stages/node.yaml), and only a force
delete removes it.

    python dev/cluster/fake_kubelet.py --root .cluster --port 16443

Standard library only, like localcluster.py, which starts and stops it (and
waits for run/fake-kubelet.ready, touched after each full list).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
DEAD_KUBELET_LABEL = "torchfleet.dev/kwok-dead-kubelet"
WATCH_SECONDS = 240


def needs_confirming(pod: dict[str, Any], fake_node: bool) -> bool:
    """A terminating pod on a fake node whose kubelet is alive."""
    meta = pod.get("metadata") or {}
    return (
        fake_node
        and bool(meta.get("deletionTimestamp"))
        and (meta.get("labels") or {}).get(DEAD_KUBELET_LABEL) != "true"
    )


def confirm_options(uid: str) -> dict[str, Any]:
    """What a kubelet sends: now, and only if the name still means this pod."""
    return {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}


def release_patch(uid: str) -> list[dict[str, Any]]:
    """Drops the finalizers (KWOK's stage did), failing if the name means another pod."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "remove", "path": "/metadata/finalizers"},
    ]


class Api:
    """Just enough of the API server over the cluster's admin certificate."""

    def __init__(self, root: Path, port: int) -> None:
        pki = root / "pki"
        self.base = f"https://127.0.0.1:{port}"
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=timeout, context=self.ctx) as response:
            return json.loads(response.read() or b"{}")

    def watch(self, path: str, version: str) -> Iterator[dict[str, Any]]:
        query = urllib.parse.urlencode(
            {
                "watch": "true",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": WATCH_SECONDS,
                "fieldSelector": "spec.nodeName!=",
            }
        )
        request = urllib.request.Request(f"{self.base}{path}?{query}")
        with urllib.request.urlopen(
            request, timeout=WATCH_SECONDS + 60, context=self.ctx
        ) as response:
            for line in response:
                if line.strip():
                    yield json.loads(line)


class FakeKubelet:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.fake_nodes: dict[str, bool] = {}

    def is_fake(self, node: str) -> bool:
        if node not in self.fake_nodes:
            try:
                found = self.api.request("GET", f"/api/v1/nodes/{node}")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
                return False  # not there (yet): asked again next time
            annotations = (found.get("metadata") or {}).get("annotations") or {}
            self.fake_nodes[node] = annotations.get(FAKE_NODE_ANNOTATION) == "fake"
        return self.fake_nodes[node]

    def handle(self, pod: dict[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if not node or not needs_confirming(pod, self.is_fake(node)):
            return
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        try:
            if meta.get("finalizers"):
                self.api.request(
                    "PATCH", path, release_patch(meta["uid"]), "application/json-patch+json"
                )
            self.api.request("DELETE", path, confirm_options(meta["uid"]))
            log(f"deleted {meta['namespace']}/{meta['name']} (uid {meta['uid']})")
        except urllib.error.HTTPError as exc:
            # 404: already gone. 409/422: the name now means another pod; leave it.
            if exc.code not in (404, 409, 422):
                raise

    def run(self, ready_file: Path) -> None:
        version = ""
        while True:
            try:
                if not version:
                    listed = self.api.request(
                        "GET", "/api/v1/pods?fieldSelector=spec.nodeName%21%3D"
                    )
                    for pod in listed.get("items") or ():
                        self.handle(pod)
                    version = listed["metadata"]["resourceVersion"]
                    ready_file.touch()
                for event in self.api.watch("/api/v1/pods", version):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":  # 410 Gone: list again
                        version = ""
                        break
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind in ("ADDED", "MODIFIED"):
                        self.handle(obj)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                # Relist: it retries every terminating pod, a failed delete included.
                log(f"watch or delete failed ({exc}); listing again in 1s")
                version = ""
                time.sleep(1)


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} fake-kubelet: {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="the cluster's .cluster dir")
    parser.add_argument("--port", type=int, required=True, help="the API server's port")
    args = parser.parse_args()
    FakeKubelet(Api(args.root, args.port)).run(args.root / "run" / "fake-kubelet.ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
