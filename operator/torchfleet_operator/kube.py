"""The Kubernetes client and the plan executor: the only module that writes.

Rules the executor keeps so that reconciling twice changes nothing:
* create: 409 AlreadyExists is success (children are deterministic by name)
  when the object is controlled by the same job, else a name conflict;
* delete: 404 NotFound is success;
* one status patch per pass, and only when the status changed; the pass's
  events are posted once it landed;
* every other API failure is counted and handed back, never raised, so the
  pass can report it in a condition and back off.

Requests go through the client's raw REST layer with plain-dict bodies: the
generated typed models would re-validate every pod manifest (and could drop
fields they do not know) for no benefit here. JSON is read and written with
orjson: decoding responses and watch lines was the largest single part of the
operator's CPU in a 300-job profile, and orjson does it in about half the time
of the standard library. Calls are blocking (urllib3); they run in worker
threads, never on kopf's event loop.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import urlencode

import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from torchfleet_operator import metrics
from torchfleet_operator.api.constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from torchfleet_operator.desired.labels import NODE_RANK_LABEL
from torchfleet_operator.desired.podgroup import (
    NATIVE_GROUP,
    NATIVE_VERSIONS,
    preferred_native_api,
    serves_gang,
)
from torchfleet_operator.planning import ChildRef, EventSpec, Plan, WorkloadPatch

log = logging.getLogger(__name__)

JOB_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}"
REQUEST_SECONDS = 30
_CORE_PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Event": "events",
}


@dataclass(frozen=True)
class ApiFailure:
    """One refused call: what, and the apiserver's own words."""

    verb: str
    kind: str
    name: str
    code: int
    message: str
    # The refusal proves the job gone: its namespace is (404 on a create in it)
    # or the job is (404 on its status). kopf's index may still hold it
    # (controller.py's _vanished).
    job_gone: bool = False


@dataclass
class ExecutionResult:
    created: int = 0
    created_pods: list[str] = field(default_factory=list)  # names, 409s included
    deleted: int = 0
    job_deleted: bool = False
    failures: list[ApiFailure] = field(default_factory=list)


def make_api_client(kubeconfig: str | None = None, pool_size: int = 32) -> client.ApiClient:
    """In-cluster config when running in a pod, else the kubeconfig (``$KUBECONFIG``)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    # Several workers each fan out creates; a small urllib3 pool would
    # serialise them and log "connection pool is full".
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def _status_body(exc: ApiException) -> dict[str, Any]:
    """The apiserver's ``Status`` object of a refusal, or {} where there is none."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def api_message(exc: ApiException) -> str:
    """The apiserver's ``Status.message`` (what kubectl would print), else the reason."""
    return str(_status_body(exc).get("message") or exc.reason or exc)


def namespace_not_found(exc: ApiException) -> bool:
    """A 404 naming a namespace (``details.kind: namespaces``): a create refused
    because its namespace no longer exists, not for want of the resource type."""
    details = _status_body(exc).get("details")
    return exc.status == 404 and isinstance(details, dict) and details.get("kind") == "namespaces"


def _refused_together(refused: ApiFailure, pods: list[dict[str, Any]]) -> list[ApiFailure]:
    """One pod of a gang refused: the others it stopped share its refusal (and
    its back-off), in its words."""
    others = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] != refused.name]
    return [replace(refused, name=name) for name in others]


def _controller_uid(manifest: dict[str, Any]) -> str | None:
    refs = (manifest.get("metadata") or {}).get("ownerReferences") or ()
    return next((r.get("uid") for r in refs if r.get("controller")), None)


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    """REST path of a namespaced collection (core kinds and PodGroups)."""
    if kind in _CORE_PLURALS:
        return f"/api/v1/namespaces/{namespace}/{_CORE_PLURALS[kind]}"
    if kind == "PodGroup":
        return f"/apis/{api_version}/namespaces/{namespace}/podgroups"
    if kind == "Workload":
        return f"/apis/{api_version}/namespaces/{namespace}/workloads"
    raise ValueError(f"no REST path known for {kind}")


FENCED = "not sent: this replica no longer holds the leader lease by its own clock"


class RawApi:
    """JSON in, JSON out over the client's REST layer; non-2xx raises ApiException."""

    def __init__(self, api: client.ApiClient, counted: bool = True) -> None:
        self.api = api
        self.counted = counted  # in torchfleet_operator_api_requests_total
        # Asked before every write; False refuses it (a leader whose lease ran
        # out by its own clock: leader.LeaderElector.holds_lease).
        self.fence: Callable[[], bool] | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        decode: bool = True,
    ) -> Any:
        """The response's JSON; None when it has none, or when the caller
        does not read it (``decode=False``: a created pod's echo)."""
        if query:
            path = f"{path}?{urlencode(query)}"
        _, url, headers, _, _ = self.api.param_serialize(
            method,
            path,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        if self.counted:
            metrics.API_REQUESTS.labels(verb=method).inc()
        if method == "GET":
            response = self.api.call_api(
                method, url, headers, body=body, _request_timeout=REQUEST_SECONDS
            )
            response.read()
            if not 200 <= response.status <= 299:
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            data = response.data
        else:
            data = self._write(method, url, headers, body)
        return orjson.loads(data) if data and decode else None

    def _write(self, method: str, url: str, headers: dict[str, str], body: Any) -> bytes:
        """A write straight through the client's urllib3 pool. The client's
        ``call_api`` adds content-type dispatch and a response wrapper to every
        call (about an eighth of a write's CPU in a 300-job py-spy profile,
        with parsing the echoed body a fifth). Bodies are JSON, which
        apply-patch+yaml takes as well."""
        if self.fence is not None and not self.fence():
            raise ApiException(status=0, reason=FENCED)
        encoded = None if body is None else orjson.dumps(body)
        try:
            response = self.api.rest_client.pool_manager.request(
                method,
                url,
                body=encoded,
                headers=headers,
                timeout=urllib3.Timeout(total=REQUEST_SECONDS),
            )
        except urllib3.exceptions.SSLError as exc:  # as the client's REST layer reports it
            raise ApiException(status=0, reason=f"{type(exc).__name__}\n{exc}") from exc
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return bytes(response.data)

    def stream(
        self, path: str, query: dict[str, Any], stop: threading.Event, read_timeout: float = 360
    ) -> Iterator[list[bytes]]:
        """A watch: yields the complete JSON lines of each chunk as it arrives,
        until the apiserver ends the stream or ``stop`` is set. Not counted: one
        long request, not a call per event."""
        _, url, headers, _, _ = self.api.param_serialize(
            "GET",
            f"{path}?{urlencode(query)}",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.rest_client.pool_manager.request(
            "GET",
            url,
            headers=headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=read_timeout),
        )
        try:
            if not 200 <= response.status <= 299:
                response.read()
                raise ApiException(status=response.status, reason=response.reason)
            pending = b""
            for chunk in response.stream(256 * 1024):
                if stop.is_set():
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                complete = [line for line in lines if line.strip()]
                if complete:
                    yield complete
        finally:
            response.release_conn()


class Executor:
    """Carries out plans against the apiserver."""

    def __init__(self, api: client.ApiClient, concurrency: int) -> None:
        self.raw = RawApi(api)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kube")
        # Events have their own two threads: best effort, they never hold a create.
        self._events = ThreadPoolExecutor(max_workers=2, thread_name_prefix="events")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._events.shutdown(wait=False, cancel_futures=True)

    def execute(self, namespace: str, job: dict[str, Any], plan: Plan) -> ExecutionResult:
        """Deletes, then creates; the status and the events are separate
        (``write_status``, then ``post_events`` once it landed).

        Creation order: Services, claims and PodGroups (pods refer to them),
        together with the plan's dry runs; then a new gang's master alone (slow
        start, as the Job controller's: a refused first pod stops the rest);
        then every other pod at once.
        """
        result = ExecutionResult()
        deleted = self._fan_out(
            [partial(self._delete_child, namespace, ref) for ref in plan.delete]
        )
        result.deleted = deleted.count(None)
        result.failures.extend(f for f in deleted if f is not None)
        first = [m for m in plan.create if m["kind"] != "Pod"]
        pods = [m for m in plan.create if m["kind"] == "Pod"]
        checked = self._fan_out(
            [partial(self._create, namespace, m) for m in first]
            + [partial(self._dry_run, namespace, m) for m in plan.dry_run]
        )
        self._count(result, first, checked[: len(first)])
        refused = next((f for f in checked[len(first) :] if f is not None), None)
        if result.failures:
            pods = []  # a refused service, claim or PodGroup: no pods without them
        elif refused is not None:  # an invalid pod: no pod of the gang
            result.failures += [refused, *_refused_together(refused, pods)]
            pods = []
        master = [m for m in pods if m["metadata"]["labels"].get(NODE_RANK_LABEL) == "0"]
        rest = [m for m in pods if m["metadata"]["labels"].get(NODE_RANK_LABEL) != "0"]
        for batch in (master, rest):
            created = self._fan_out([partial(self._create, namespace, m) for m in batch])
            self._count(result, batch, created)
            failed = next((f for f in created if f is not None), None)
            if batch is master and failed is not None:
                result.failures += _refused_together(failed, rest)
                break
        for patch in plan.workload_patches:
            failure = self._patch_workload(namespace, patch)
            if failure:
                result.failures.append(failure)
        if plan.delete_job:
            failure = self._delete_job(namespace, job["metadata"]["name"])
            result.job_deleted = failure is None
            if failure:
                result.failures.append(failure)
        return result

    @staticmethod
    def _count(
        result: ExecutionResult, batch: list[dict[str, Any]], outcomes: list[ApiFailure | None]
    ) -> None:
        for manifest, failure in zip(batch, outcomes, strict=True):
            if failure is not None:
                result.failures.append(failure)
                continue
            result.created += 1
            if manifest["kind"] == "Pod":
                result.created_pods.append(manifest["metadata"]["name"])

    def _fan_out(self, calls: Sequence[Callable[[], ApiFailure | None]]) -> list[ApiFailure | None]:
        if len(calls) <= 1:
            return [call() for call in calls]
        return list(self._pool.map(lambda call: call(), calls))

    def _create(self, namespace: str, manifest: dict[str, Any]) -> ApiFailure | None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            self.raw.request(
                "POST",
                collection_path(manifest["apiVersion"], kind, namespace),
                manifest,
                decode=False,
            )
        except ApiException as exc:
            if exc.status == 409:  # it exists: deterministic names make that success,
                return self._conflict(namespace, manifest)  # if it is this job's own
            return self._failure("create", kind, name, exc)
        if kind == "Pod":
            metrics.PODS_CREATED.inc()
        return None

    def _conflict(self, namespace: str, manifest: dict[str, Any]) -> ApiFailure | None:
        """None when the object that holds the name is controlled by the same owner
        as ``manifest`` (this job): an earlier pass made it. Anything else is a
        name conflict: someone else's Service or volume is never used as the job's.

        Read with a list call (which the operator may already make), not a get.
        """
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        wanted = _controller_uid(manifest)
        path = collection_path(manifest["apiVersion"], kind, namespace)
        try:
            found = self.raw.request("GET", path, query={"fieldSelector": f"metadata.name={name}"})
        except ApiException as exc:
            return self._failure("create", kind, name, exc)
        items = (found or {}).get("items") or []
        if not items:  # deleted meanwhile: the next pass creates it
            return ApiFailure("create", kind, name, 409, f'{kind} "{name}" is being deleted')
        owner = _controller_uid(items[0])
        if owner == wanted:
            return None
        metrics.API_ERRORS.labels(verb="create", resource=kind, code="409").inc()
        holder = f"controlled by uid {owner}" if owner else "not controlled by any object"
        return ApiFailure(
            "create",
            kind,
            name,
            409,
            f'{kind} "{name}" already exists and is not this TrainingJob\'s ({holder}); '
            f"rename the job or delete that {kind}",
        )

    def _dry_run(self, namespace: str, manifest: dict[str, Any]) -> ApiFailure | None:
        path = collection_path(manifest["apiVersion"], manifest["kind"], namespace)
        try:
            self.raw.request("POST", path, manifest, query={"dryRun": "All"}, decode=False)
        except ApiException as exc:
            if exc.status in (400, 422):  # invalid: creating it would fail the same way
                return self._failure("create", manifest["kind"], manifest["metadata"]["name"], exc)
        return None  # anything else: the real creates report it

    def _delete_child(self, namespace: str, ref: ChildRef) -> ApiFailure | None:
        """A pod, or a finished gang generation's PodGroup."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if ref.uid:
            # Only this incarnation: never a newer one that reuses the name.
            body["preconditions"] = {"uid": ref.uid}
        if ref.grace_period_seconds is not None:
            body["gracePeriodSeconds"] = ref.grace_period_seconds
        try:
            self.raw.request(
                "DELETE",
                f"{collection_path(ref.api_version, ref.kind, namespace)}/{ref.name}",
                body,
                decode=False,
            )
        except ApiException as exc:
            # 404: already gone. 409: the uid precondition failed, so the
            # object under that name is a newer one and is not ours to delete.
            if exc.status in (404, 409):
                return None
            return self._failure("delete", ref.kind, ref.name, exc)
        if ref.kind == "Pod":
            metrics.PODS_DELETED.inc()
        return None

    def _patch_workload(self, namespace: str, patch: WorkloadPatch) -> ApiFailure | None:
        """Kueue's Workload: its status by server-side apply under the patch's field
        manager (as Kueue's own controllers write it), else a merge patch."""
        # The patch carries the apiVersion of the Workload it was built from.
        path = f"{collection_path(patch.body['apiVersion'], 'Workload', namespace)}/{patch.name}"
        try:
            if patch.delete_uid:
                self.raw.request(
                    "DELETE",
                    path,
                    {
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "preconditions": {"uid": patch.delete_uid},
                    },
                    decode=False,
                )
            elif patch.field_manager:
                self.raw.request(
                    "PATCH",
                    f"{path}/status",
                    patch.body,
                    query={"fieldManager": patch.field_manager, "force": "true"},
                    content_type="application/apply-patch+yaml",
                    decode=False,
                )
            else:
                self.raw.request(
                    "PATCH",
                    path,
                    patch.body,
                    content_type="application/merge-patch+json",
                    decode=False,
                )
        except ApiException as exc:
            # 404: gone with its job. 409: Kueue changed it meanwhile (or, for a
            # delete, it is a newer one); the watch brings the new version and
            # the next pass decides again.
            if exc.status in (404, 409):
                return None
            return self._failure("patch", "Workload", patch.name, exc)
        return None

    def uids(self, plural: str, namespace: str) -> set[str] | None:
        """The uids of this group's ``plural`` (trainingjobs, trainingruntimes)
        in ``namespace`` now (one list); None when the list fails (logged)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}"
        try:
            listed = self.raw.request("GET", path)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("list %s in %s failed: %s", plural, namespace, exc)
            return None
        return {item["metadata"]["uid"] for item in listed.get("items") or ()}

    def native_api(self) -> str | None:
        """Discovery: the scheduling.k8s.io version of Kubernetes' own gang
        objects (Workload, PodGroup) this API server serves, the most preferred
        the operator writes; None when it serves none of them. A lookup that
        fails for another reason than 404 raises: not served is not concluded
        from an unanswered question."""
        served = []
        for version in NATIVE_VERSIONS:
            try:
                found = self.raw.request("GET", f"/apis/{NATIVE_GROUP}/{version}")
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            if serves_gang(found):
                served.append(version)
        return preferred_native_api(served)

    def _delete_job(self, namespace: str, name: str) -> ApiFailure | None:
        try:
            self.raw.request(
                "DELETE",
                JOB_PATH.format(namespace=namespace, name=name),
                {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
                decode=False,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            return self._failure("delete", KIND, name, exc)
        return None

    def write_status(self, namespace: str, name: str, status: dict[str, Any]) -> ApiFailure | None:
        """The pass's one status write: a merge patch of the status subresource."""
        try:
            self.raw.request(
                "PATCH",
                JOB_PATH.format(namespace=namespace, name=name) + "/status",
                {"status": status},
                content_type="application/merge-patch+json",
                decode=False,
            )
        except ApiException as exc:
            if exc.status == 404:  # deleted meanwhile: nothing left to report on
                return ApiFailure("patch", f"{KIND}/status", name, 404, api_message(exc), True)
            return self._failure("patch", f"{KIND}/status", name, exc)
        return None

    def post_events(self, namespace: str, job: dict[str, Any], events: Sequence[EventSpec]) -> None:
        """Queues the events. They are posted in the background, as client-go's
        recorder does: the status is the record, and waiting for them held every
        pass one round trip."""
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        for event in events:
            self._events.submit(self._post_event, namespace, job, event, now)

    def _post_event(self, namespace: str, job: dict[str, Any], event: EventSpec, now: str) -> None:
        meta = job["metadata"]
        # A once-per-job event's name is fixed by the job's uid, the reason and its key.
        once = f"{meta.get('uid')}.{event.reason.lower()}" + (f".{event.key}" if event.key else "")
        suffix = once if event.once else uuid.uuid4().hex[:16]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{suffix}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "torchfleet-operator"},
        }
        try:
            self.raw.request("POST", collection_path("v1", "Event", namespace), body, decode=False)
        except ApiException as exc:  # events are best effort; the status is the record
            if event.once and exc.status == 409:
                return  # posted before, by this operator before a restart or another replica
            self._failure("create", "Event", event.reason, exc)

    @staticmethod
    def _failure(verb: str, kind: str, name: str, exc: ApiException) -> ApiFailure:
        code = int(exc.status or 0)
        metrics.API_ERRORS.labels(verb=verb, resource=kind, code=str(code)).inc()
        message = api_message(exc)
        log.warning("%s %s %s failed (%s): %s", verb, kind, name, code, message)
        gone = verb == "create" and namespace_not_found(exc)
        return ApiFailure(verb, kind, name, code, message, job_gone=gone)
