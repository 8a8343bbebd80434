"""The few API calls a node makes, on plain dicts.

The agent works on the JSON the API server sends (as the kubelet's status
code does), so every call here reads raw JSON rather than typed models.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("nodeagent.kube")

STRATEGIC_MERGE = "application/strategic-merge-patch+json"


class Kube:
    def __init__(self, kubeconfig: str) -> None:
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        self.api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api_client)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> Any:
        """One API call on plain JSON; raises ApiException on an error status."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*params, _request_timeout=30)
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiException(status=response.status, reason=response.reason, body=data)
        return json.loads(data) if data else None

    def _ignore(self, statuses: tuple[int, ...], method: str, path: str, body: Any = None) -> Any:
        try:
            return self.request(method, path, body)
        except ApiException as error:
            if error.status not in statuses:
                raise
            return None

    # ---- nodes ------------------------------------------------------------------

    def register_node(self, manifest: dict[str, Any]) -> str:
        """Creates the Node, or takes over one left by an earlier run; its uid."""
        name = manifest["metadata"]["name"]
        created = self._ignore((409,), "POST", "/api/v1/nodes", manifest)
        if created is not None:
            return str(created["metadata"]["uid"])
        takeover = {
            "metadata": {"labels": manifest["metadata"]["labels"]},
            "spec": manifest["spec"],
        }
        patched = self.request("PATCH", f"/api/v1/nodes/{name}", takeover, STRATEGIC_MERGE)
        return str(patched["metadata"]["uid"])

    def patch_node_status(self, name: str, status: dict[str, Any]) -> None:
        self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, STRATEGIC_MERGE)

    def list_nodes(self, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        query = [("labelSelector", label_selector)]
        listing = self.request("GET", "/api/v1/nodes", query=query)
        return listing["items"], listing["metadata"]["resourceVersion"]

    def watch_nodes(
        self, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> Iterator[dict[str, Any]]:
        """Watch events ({type, raw_object}) of the selected nodes."""
        stream = watch.Watch().stream(
            self.core.list_node,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
        )
        yield from stream

    def delete_node(self, name: str) -> None:
        self._ignore((404,), "DELETE", f"/api/v1/nodes/{name}")

    def renew_lease(self, manifest: dict[str, Any], renewal: dict[str, Any]) -> None:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        try:
            self.request("PATCH", f"{leases}/{name}", renewal, STRATEGIC_MERGE)
        except ApiException as error:
            if error.status != 404:
                raise
            self.request("POST", leases, manifest)

    # ---- pods -------------------------------------------------------------------

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        listing = self.request("GET", "/api/v1/pods")
        return listing["items"], listing["metadata"]["resourceVersion"]

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """Watch events ({type, raw_object}) from ``resource_version`` on."""
        stream = watch.Watch().stream(
            self.core.list_pod_for_all_namespaces,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
        )
        yield from stream

    def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        self.request("PATCH", path, {"status": status}, STRATEGIC_MERGE)

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a pod: remove it at once, if it is still
        the pod we ran (a new pod may have taken the name)."""
        options = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        self._ignore((404, 409), "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", options)

    # ---- data the pods reference --------------------------------------------------

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        found = self._ignore((404,), "GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return None if found is None else dict(found.get("data") or {})

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        found = self._ignore((404,), "GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if found is None:
            return None
        data = found.get("data") or {}
        return {key: base64.b64decode(value).decode() for key, value in data.items()}
