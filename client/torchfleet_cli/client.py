"""The Python client: ``Client().run(...)`` packs a script, creates its
TrainingJob and then the ConfigMap the job owns, and returns a :class:`Job` handle with ``status``
(the CRD's own pydantic models), ``wait()``, ``logs()`` and ``delete()``.

The only module here that talks to the API server (the kubernetes client);
kubeconfig, context and namespace are found as kubectl finds them.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchfleet_cli import kept_logs, manifest
from torchfleet_cli.packing import pack
from torchfleet_cli.progress import FINAL_PHASES
from torchfleet_operator.api import GROUP, PLURAL, VERSION, TrainingJobStatus
from torchfleet_operator.api.constants import TRAINER_CONTAINER_NAME
from torchfleet_operator.api.parse import read_status
from torchfleet_operator.desired.labels import (
    JOB_NAME_LABEL,
    NODE_RANK_LABEL,
    RESTART_LABEL,
)


class JobNotFound(LookupError):
    """No TrainingJob of that name in the namespace."""


class KeptLogNotRead(RuntimeError):
    """The reader pod ended without printing the kept log (no such file)."""


class Job:
    """A handle on one TrainingJob; every property reads the API server afresh."""

    def __init__(self, client: Client, name: str, namespace: str) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"Job({self.namespace}/{self.name})"

    def get(self) -> dict[str, Any]:
        """The TrainingJob as the API server holds it."""
        return self.client.get_raw(self.name, self.namespace)

    @property
    def status(self) -> TrainingJobStatus:
        return read_status(self.get().get("status"))

    @property
    def phase(self) -> str | None:
        return self.status.phase

    def wait(self, timeout: float | None = None, interval: float = 2.0) -> str:
        """Waits until the job Succeeded or Failed and returns that phase;
        raises TimeoutError past ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            phase = self.phase
            if phase in FINAL_PHASES:
                assert phase is not None
                return phase
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self} is still {phase} after {timeout:g}s")
            time.sleep(interval)

    def logs(self, rank: int = 0, follow: bool = False) -> str | Iterator[str]:
        """Node rank ``rank``'s live pod log: all of it, or (``follow``) its
        lines as they come."""
        return self.client.logs(self, rank=rank, follow=follow)

    def follow_logs(self, rank: int = 0) -> Iterator[str]:
        """Node rank ``rank``'s log, gang after gang, until the job ends."""
        return self.client.follow_logs(self, rank=rank)

    def delete(self) -> None:
        self.client.delete(self)


class Client:
    """TrainingJobs in one namespace of one cluster. ``kubeconfig`` and
    ``context`` default as kubectl's (``KUBECONFIG``, then ~/.kube/config, its
    current context; inside a pod, its service account); ``namespace`` to the
    context's, else ``default``."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
    ) -> None:
        from kubernetes import client, config

        try:
            self.api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
            found_namespace = _context_namespace(kubeconfig, context)
        except config.ConfigException as no_kubeconfig:
            if kubeconfig is not None or context is not None:
                raise
            try:
                config.load_incluster_config()
            except config.ConfigException:
                raise config.ConfigException(
                    f"{no_kubeconfig}; and this is not a pod with a service account. "
                    "Set KUBECONFIG or pass --kubeconfig"
                ) from None
            self.api_client = client.ApiClient()
            found_namespace = _pod_namespace()
        self.namespace = namespace or found_namespace or "default"
        # Any: the client's generated types say little that the calls here need.
        self.custom: Any = client.CustomObjectsApi(self.api_client)
        self.core: Any = client.CoreV1Api(self.api_client)

    # ---- the verbs ----

    def run(
        self,
        script_or_folder: str | Path,
        nodes: int = 1,
        procs_per_node: int | str = 1,
        args: list[str] | tuple[str, ...] = (),
        image: str | None = None,
        *,
        name: str | None = None,
        entry: str | None = None,
        gpus: int = 0,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, str]] | None = None,
        namespace: str | None = None,
        runtime: str | None = None,
    ) -> Job:
        """Creates a TrainingJob that runs the script (or a small folder,
        running ``entry``) with torchrun on ``nodes`` pods, then the
        ConfigMap holding it, owned by the job; a ConfigMap the API server
        refuses deletes the job again. ``runtime``
        (``NAME`` or ``KIND/NAME``) names the runtime the job takes the rest
        from (image, pod templates, scheduling: :func:`manifest.training_job`)."""
        namespace = namespace or self.namespace
        package = pack(script_or_folder, entry)
        name = name or manifest.job_name(Path(script_or_folder).name)
        body = manifest.training_job(
            name,
            package,
            nodes=nodes,
            procs_per_node=procs_per_node,
            args=args,
            image=image,
            gpus=gpus,
            node_selector=node_selector,
            tolerations=tolerations,
            runtime=manifest.runtime_ref(runtime) if runtime else None,
        )
        # The job first, then its code owned by it from its first instant: a
        # command that dies in between leaves a job (listed, deleted with its
        # pods as any) and never a ConfigMap that nothing owns. A pod made in
        # that instant waits for its volume, as the kubelet waits for a
        # missing ConfigMap.
        created = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body
        )
        configmap = manifest.code_configmap(name, package, owner=created)
        try:
            self.core.create_namespaced_config_map(namespace, configmap)
        except BaseException:  # Ctrl-C too: no job is left without its code
            self.delete(name, namespace)
            raise
        return Job(self, name, namespace)

    def get(self, name: str, namespace: str | None = None) -> Job:
        """The job ``name``; raises :class:`JobNotFound` if there is none."""
        job = Job(self, name, namespace or self.namespace)
        job.get()
        return job

    def get_raw(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        namespace = namespace or self.namespace
        try:
            found = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        except ApiException as error:
            if error.status == 404:
                raise JobNotFound(f"no TrainingJob {name} in namespace {namespace}") from None
            raise
        return dict(found)

    def list_raw(
        self, namespace: str | None = None, all_namespaces: bool = False
    ) -> list[dict[str, Any]]:
        if all_namespaces:
            listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        else:
            listed = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace or self.namespace, PLURAL
            )
        return list(listed["items"])

    def list(
        self, namespace: str | None = None, all_namespaces: bool = False
    ) -> builtins.list[Job]:
        return [
            Job(self, item["metadata"]["name"], item["metadata"]["namespace"])
            for item in self.list_raw(namespace, all_namespaces)
        ]

    def delete(self, job: Job | str, namespace: str | None = None) -> None:
        """Deletes the job; the garbage collector then deletes its pods and code."""
        from kubernetes.client.exceptions import ApiException

        name, namespace = _name_and_namespace(job, namespace or self.namespace)
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"propagationPolicy": "Background"},
            )
        except ApiException as error:
            if error.status == 404:
                raise JobNotFound(f"no TrainingJob {name} in namespace {namespace}") from None
            raise

    def logs(
        self, job: Job | str, rank: int = 0, follow: bool = False, namespace: str | None = None
    ) -> str | Iterator[str]:
        """The trainer container's log of node rank ``rank``'s live pod (the
        newest gang's): all of it, or (``follow``) its lines as they come."""
        name, namespace = _name_and_namespace(job, namespace or self.namespace)
        pod = self.rank_pod(name, rank, namespace)
        if not follow:
            return str(
                self.core.read_namespaced_pod_log(pod, namespace, container=TRAINER_CONTAINER_NAME)
            )
        response = self.core.read_namespaced_pod_log(
            pod, namespace, container=TRAINER_CONTAINER_NAME, follow=True, _preload_content=False
        )
        return _lines(response)

    def kept_log(
        self,
        job: Job | str,
        generation: int,
        round_: int = 0,
        rank: int = 0,
        namespace: str | None = None,
        timeout: float = 120,
    ) -> str:
        """Process rank ``rank``'s kept log of gang ``generation``, in-place round
        ``round_``, read from the checkpoint volume by a short-lived pod
        (kept_logs.reader_pod), deleted once read. Raises KeptLogNotRead with
        what the pod said (a file that is not there: cat's message)."""
        name, namespace = _name_and_namespace(job, namespace or self.namespace)
        body = self.get_raw(name, namespace)
        pod = kept_logs.reader_pod(body, generation, round_, rank)
        pod["metadata"]["ownerReferences"] = [manifest.owner_reference(body)]
        pod_name = pod["metadata"]["name"]
        self.core.create_namespaced_pod(namespace, pod)
        try:
            phase = self._pod_ended(pod_name, namespace, timeout)
            text = str(self.core.read_namespaced_pod_log(pod_name, namespace))
        finally:
            self.core.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)
        if phase != "Succeeded":
            raise KeptLogNotRead(f"{pod_name} {phase or 'did not end in time'}: {text.strip()}")
        return text

    def _pod_ended(self, pod: str, namespace: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            phase = self.core.read_namespaced_pod(pod, namespace).status.phase
            if phase in ("Succeeded", "Failed"):
                return str(phase)
            time.sleep(0.5)
        return None

    def rank_pod(self, job: str, rank: int, namespace: str) -> str:
        """The name of node rank ``rank``'s pod of the job's newest gang."""
        newest = self._newest_rank_pod(job, rank, namespace)
        if newest is None:
            raise JobNotFound(f"no live pod of node rank {rank} of {namespace}/{job}")
        return str(newest.metadata.name)

    def _newest_rank_pod(self, job: str, rank: int, namespace: str) -> Any:
        selector = f"{JOB_NAME_LABEL}={job},{NODE_RANK_LABEL}={rank}"
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return max(live, key=_gang, default=None)

    def follow_logs(
        self,
        job: Job | str,
        rank: int = 0,
        namespace: str | None = None,
        ended: Callable[[], bool] | None = None,
        interval: float = 1.0,
    ) -> Iterator[str]:
        """Node rank ``rank``'s trainer log gang after gang, as its lines come:
        each pod of that rank from its first line, after a header line, until
        the job has ended and its last pod's log is read to the end. A pod that
        has not started yet is waited for. ``ended`` says whether the job has
        ended (default: its phase, read from the API server)."""
        from kubernetes.client.exceptions import ApiException

        name, namespace = _name_and_namespace(job, namespace or self.namespace)
        if ended is None:
            handle = Job(self, name, namespace)

            def ended() -> bool:
                return handle.phase in FINAL_PHASES

        done: set[str] = set()
        while True:
            pod = self._newest_rank_pod(name, rank, namespace)
            if pod is None or pod.metadata.uid in done:
                if ended():
                    return
                time.sleep(interval)
                continue
            try:
                response = self.core.read_namespaced_pod_log(
                    pod.metadata.name,
                    namespace,
                    container=TRAINER_CONTAINER_NAME,
                    follow=True,
                    _preload_content=False,
                )
            except ApiException as error:
                if error.status not in (400, 404):
                    raise
                if ended():
                    return
                if error.status == 404:  # deleted meanwhile: the next gang's, if any
                    done.add(pod.metadata.uid)
                else:  # 400: its container has not started yet
                    time.sleep(interval)
                continue
            yield f"── {pod.metadata.name} (gang {_gang(pod)}) ──"
            yield from _lines(response)
            done.add(pod.metadata.uid)


def _gang(pod: Any) -> int:
    """The gang (restart) a pod of the job belongs to, from its label."""
    value = (pod.metadata.labels or {}).get(RESTART_LABEL, "0")
    return int(value) if str(value).isdigit() else 0


def _name_and_namespace(job: Job | str, namespace: str) -> tuple[str, str]:
    if isinstance(job, Job):
        return job.name, job.namespace
    return job, namespace


def _lines(response: Any) -> Iterator[str]:
    """A streamed HTTP response's lines, decoded; the connection is released at the end."""
    try:
        pending = b""
        for chunk in response.stream(4096):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")
    finally:
        response.release_conn()


def _context_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    from kubernetes import config

    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == context), None) if context else active
    return ((chosen or {}).get("context") or {}).get("namespace")


def _pod_namespace() -> str | None:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return path.read_text().strip() if path.exists() else None
