"""The trainer container's securityContext: secure by default under Pod Security.

The Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
decide which namespaces accept a pod. The operator's trainer container asks for
no more than the job needs:

- restricted: no privilege escalation, every capability dropped, the
  RuntimeDefault seccomp profile, and (when the pod runs the operator's own
  trainer image, whose user is uid 1000) runAsNonRoot. A job that brings its
  own image states runAsNonRoot in its template, since only it knows the
  image's user.
- RDMA (network.rdmaResources): the same plus exactly the IPC_LOCK capability,
  which registering RDMA memory needs. Baseline allows no added capability
  outside its default set, so such pods need a namespace at the privileged
  level (or a Pod Security exemption).
- network.hostNetwork: baseline forbids host namespaces, so privileged too.

Beyond what the levels ask (what a scanner such as checkov checks):

- the root filesystem is read-only, with an emptyDir over /tmp for what the
  trainer writes at run time (tempfile, torchelastic's logs, TorchInductor's
  cache under /tmp) and the caches that would go under HOME (Triton's kernels,
  C++ extensions built on first use) pointed there; the operator's trainer
  image gets HOME=/tmp too (its home holds nothing). A job that brings its own
  image keeps its HOME (a home with user-installed packages stays readable);
  anything else it writes needs a volume, or readOnlyRootFilesystem: false in
  its template;
- no ServiceAccount token is mounted: the trainer never calls the API server.
  A template that sets automountServiceAccountToken gets what it says;
- the pod's own securityContext carries the RuntimeDefault seccomp profile, so
  a template's sidecars have it too.

A role template's securityContext is merged over this key by key (pods.py):
it keeps what the operator set unless it says otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from torchfleet_operator.api.v1alpha1 import TrainingJobSpec

IPC_LOCK = "IPC_LOCK"

# The writable place on a read-only root: an emptyDir over /tmp.
SCRATCH_VOLUME = "trainer-tmp"
SCRATCH_PATH = "/tmp"
# Caches that default to HOME, kept on the scratch volume (a template's env wins).
SCRATCH_CACHE_ENV = {
    "TRITON_CACHE_DIR": f"{SCRATCH_PATH}/.triton/cache",
    "TORCH_EXTENSIONS_DIR": f"{SCRATCH_PATH}/.cache/torch_extensions",
}
RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}

# Pod Security levels, as the namespace label pod-security.kubernetes.io/enforce names them.
RESTRICTED = "restricted"
PRIVILEGED = "privileged"


def needs_ipc_lock(spec: TrainingJobSpec) -> bool:
    """Registering RDMA memory pins pages: IPC_LOCK, and only with RDMA devices."""
    return bool(spec.network.rdma_resources)


def trainer_security_context(spec: TrainingJobSpec, runs_default_image: bool) -> dict[str, Any]:
    """What the trainer container gets before its template is merged over it."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if needs_ipc_lock(spec):
        capabilities["add"] = [IPC_LOCK]
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": capabilities,
        "readOnlyRootFilesystem": True,
        "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
    }
    if runs_default_image:
        context["runAsNonRoot"] = True
    return context


def pod_security_context() -> dict[str, Any]:
    """The pod's own securityContext before its template's is merged over it."""
    return {"seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP)}


def has_read_only_root(container: dict[str, Any]) -> bool:
    return bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))


def scratch_env(runs_default_image: bool) -> dict[str, str]:
    """Where a read-only-root trainer's caches go: HOME itself only for the
    operator's image, whose home (/home/trainer) holds nothing to read."""
    env = dict(SCRATCH_CACHE_ENV)
    if runs_default_image:
        env["HOME"] = SCRATCH_PATH
    return env


def scratch_volume() -> dict[str, Any]:
    # No sizeLimit: compiled-kernel caches grow with the model, as a writable
    # root layer would; the node's ephemeral storage bounds it.
    return {"name": SCRATCH_VOLUME, "emptyDir": {}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH}


# The API server's refusal: `pods "x" is forbidden: violates PodSecurity "baseline:latest": ...`
_REFUSAL = re.compile(r'violates PodSecurity "([a-z]+)(?::[^"]*)?"')


def describe_refusal(message: str) -> str | None:
    """A Pod Security admission refusal as condition text naming the level; None
    for any other refusal. The API server's message names the fields."""
    match = _REFUSAL.search(message)
    if match is None:
        return None
    level = match.group(1)
    return (
        f"the namespace enforces Pod Security level {level!r} (label "
        f"pod-security.kubernetes.io/enforce) and refused the pod: {message}. RDMA "
        f"(IPC_LOCK) and hostNetwork need the {PRIVILEGED!r} level; everything else "
        f"passes {RESTRICTED!r}"
    )
