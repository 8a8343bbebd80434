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

A role template's securityContext is merged over this key by key (pods.py):
it keeps what the operator set unless it says otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from torchfleet_operator.api.v1alpha1 import TrainingJobSpec

IPC_LOCK = "IPC_LOCK"

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
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if runs_default_image:
        context["runAsNonRoot"] = True
    return context


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
