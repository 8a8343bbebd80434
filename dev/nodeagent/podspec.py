"""Pure translation of a pod (as a plain dict from the API) into what to launch.

Nothing here touches the machine or the API server: lookups the node would do
against the API (ConfigMaps, Secrets) come in as callables, so the whole
translation is tested with plain dicts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Looks a key up in a ConfigMap or Secret: (namespace, name, key) -> value,
# None when the object or key is missing.
KeyLookup = Callable[[str, str, str], str | None]
# Reads a whole ConfigMap or Secret: (namespace, name) -> data, None if missing.
DataLookup = Callable[[str, str], Mapping[str, str] | None]


class PodSpecError(ValueError):
    """The pod asks for something this node cannot provide; names the field."""


class SourceMissing(PodSpecError):
    """A ConfigMap or Secret the pod needs (not optional) does not exist yet. The
    kubelet keeps such a pod waiting (ContainerCreating, a FailedMount event;
    CreateContainerConfigError for an env source) and looks again, since it
    may be created after the pod: so does the agent (pod.py)."""

    def __init__(self, message: str, reason: str = "ContainerCreating") -> None:
        super().__init__(message)
        self.reason = reason  # the containers' waiting reason meanwhile


@dataclass(frozen=True)
class Mount:
    """One mount inside the pod's private mount namespace."""

    target: str
    # A host path to bind, or None for a fresh tmpfs (emptyDir medium Memory).
    source: str | None
    read_only: bool = False
    tmpfs_size: str | None = None


@dataclass(frozen=True)
class Limits:
    """What a container's ``resources.limits`` asks the node to enforce."""

    millicpu: int | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True)
class ContainerLaunch:
    name: str
    argv: list[str]
    env: dict[str, str]
    working_dir: str
    mounts: list[Mount] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class VolumeSource:
    """Where a pod volume lives on this machine."""

    # "dir": a host directory to bind; "tmpfs": a memory-backed mount;
    # "files": a directory the agent fills from ConfigMap/Secret data.
    kind: str
    path: str | None = None
    tmpfs_size: str | None = None
    files: dict[str, str] = field(default_factory=dict)


_QUANTITY = re.compile(r"([0-9.]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?")
_QUANTITY_FACTORS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def quantity_bytes(quantity: str, where: str) -> int:
    """A Kubernetes memory quantity ("64Mi", "1G", "1500000") in bytes."""
    match = _QUANTITY.fullmatch(str(quantity).strip())
    if not match:
        raise PodSpecError(f"{where}: {quantity!r} is not a memory quantity")
    return int(float(match.group(1)) * _QUANTITY_FACTORS[match.group(2)])


_CPU_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]*)?)(m)?")


def quantity_millicpu(quantity: Any, where: str) -> int:
    """A CPU quantity ("200m", "1", "0.5", 2) in thousandths of a CPU, rounded
    up as the API server rounds it."""
    match = _CPU_QUANTITY.fullmatch(str(quantity).strip())
    if not match:
        raise PodSpecError(f"{where}: {quantity!r} is not a CPU quantity")
    number = float(match.group(1))
    return math.ceil(number if match.group(2) else number * 1000)


def container_limits(container: Mapping[str, Any]) -> Limits:
    limits = (container.get("resources") or {}).get("limits") or {}
    where = f"containers[{container.get('name')}].resources.limits"
    cpu, memory = limits.get("cpu"), limits.get("memory")
    return Limits(
        millicpu=None if cpu is None else quantity_millicpu(cpu, f"{where}.cpu"),
        memory_bytes=None if memory is None else quantity_bytes(memory, f"{where}.memory"),
    )


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names are replaced, unknown ones
    are left as written, and ``$$`` escapes a dollar."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(replace, text)


def field_ref_value(pod: Mapping[str, Any], field_path: str) -> str:
    """The downward API's ``fieldRef`` for the fields pods commonly use."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs") or []),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs") or []),
    }
    if field_path in simple:
        return simple[field_path] or ""
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise PodSpecError(f"valueFrom.fieldRef.fieldPath {field_path!r} is not supported")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    base_env: Mapping[str, str],
    lookup_config: KeyLookup,
    lookup_secret: KeyLookup,
    read_config: DataLookup,
    read_secret: DataLookup,
) -> dict[str, str]:
    """The process env: the node's base env, then ``envFrom``, then ``env`` in
    order, each value expanded against what came before (as the kubelet does)."""
    namespace = pod["metadata"]["namespace"]
    env = dict(base_env)
    for source in container.get("envFrom") or []:
        env.update(_env_from(namespace, source, read_config, read_secret))
    for index, var in enumerate(container.get("env") or []):
        where = f"containers[{container.get('name')}].env[{index}]"
        if "valueFrom" in var and var["valueFrom"] is not None:
            value = _value_from(pod, container, var["valueFrom"], lookup_config, lookup_secret)
            if value is None:
                raise SourceMissing(
                    f"{where} ({var['name']}): referenced key not found",
                    "CreateContainerConfigError",
                )
        else:
            value = expand_refs(str(var.get("value") or ""), env)
        env[var["name"]] = value
    return env


def _env_from(
    namespace: str,
    source: Mapping[str, Any],
    read_config: DataLookup,
    read_secret: DataLookup,
) -> dict[str, str]:
    prefix = source.get("prefix") or ""
    for kind, reader in (("configMapRef", read_config), ("secretRef", read_secret)):
        ref = source.get(kind)
        if ref:
            data = reader(namespace, ref["name"])
            if data is None:
                if ref.get("optional"):
                    return {}
                raise SourceMissing(
                    f"envFrom.{kind} {ref['name']!r} not found", "CreateContainerConfigError"
                )
            return {prefix + key: value for key, value in data.items()}
    return {}


def _value_from(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    value_from: Mapping[str, Any],
    lookup_config: KeyLookup,
    lookup_secret: KeyLookup,
) -> str | None:
    namespace = pod["metadata"]["namespace"]
    if value_from.get("fieldRef"):
        return field_ref_value(pod, value_from["fieldRef"]["fieldPath"])
    if value_from.get("resourceFieldRef"):
        return _resource_field(container, value_from["resourceFieldRef"])
    for kind, lookup in (("configMapKeyRef", lookup_config), ("secretKeyRef", lookup_secret)):
        ref = value_from.get(kind)
        if ref:
            value = lookup(namespace, ref["name"], ref["key"])
            if value is None and ref.get("optional"):
                return ""
            return value
    raise PodSpecError(f"valueFrom {sorted(value_from)} is not supported")


def _resource_field(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    # "limits.cpu" -> resources.limits.cpu; an unset limit reads as "0" here
    # (the kubelet would report the node's allocatable instead).
    section, _, resource = str(ref["resource"]).partition(".")
    resources = container.get("resources") or {}
    return str((resources.get(section) or {}).get(resource, "0"))


def volume_sources(
    pod: Mapping[str, Any],
    pod_dir: Path,
    claim_dir: Callable[[str, str], Path],
    read_config: DataLookup,
    read_secret: DataLookup,
) -> dict[str, VolumeSource]:
    """Maps each pod volume to a local directory, a tmpfs, or files to write.

    A PVC is a directory per claim (shared by every pod that mounts the claim,
    and kept after the pod goes, as a real volume would be); an emptyDir lives
    and dies with the pod.
    """
    namespace = pod["metadata"]["namespace"]
    sources: dict[str, VolumeSource] = {}
    for index, volume in enumerate(pod.get("spec", {}).get("volumes") or []):
        name = volume["name"]
        where = f"spec.volumes[{index}] ({name})"
        if volume.get("persistentVolumeClaim"):
            claim = volume["persistentVolumeClaim"]["claimName"]
            sources[name] = VolumeSource("dir", str(claim_dir(namespace, claim)))
        elif "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            if empty.get("medium") == "Memory":
                size = empty.get("sizeLimit")
                size_bytes = quantity_bytes(size, f"{where}.emptyDir.sizeLimit") if size else None
                tmpfs_size = None if size_bytes is None else str(size_bytes)
                sources[name] = VolumeSource("tmpfs", tmpfs_size=tmpfs_size)
            else:
                sources[name] = VolumeSource("dir", str(pod_dir / "volumes" / name))
        elif volume.get("hostPath"):
            sources[name] = VolumeSource("dir", volume["hostPath"]["path"])
        elif volume.get("configMap") or volume.get("secret") or volume.get("projected"):
            files = _projected_files(namespace, volume, read_config, read_secret, where)
            sources[name] = VolumeSource("files", str(pod_dir / "volumes" / name), files=files)
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise PodSpecError(f"{where}: volume type {kinds} is not supported by the node agent")
    return sources


def _projected_files(
    namespace: str,
    volume: Mapping[str, Any],
    read_config: DataLookup,
    read_secret: DataLookup,
    where: str,
) -> dict[str, str]:
    """ConfigMap, Secret and projected volumes as {relative path: content}.

    Service account tokens in projected volumes are left out: nothing that
    runs on this node talks to the API server.
    """
    parts: list[tuple[str, Mapping[str, Any]]] = []
    if volume.get("configMap"):
        parts.append(("configMap", volume["configMap"]))
    if volume.get("secret"):
        parts.append(("secret", {**volume["secret"], "name": volume["secret"].get("secretName")}))
    for projection in (volume.get("projected") or {}).get("sources") or []:
        for kind in ("configMap", "secret"):
            if projection.get(kind):
                parts.append((kind, projection[kind]))
    files: dict[str, str] = {}
    for kind, ref in parts:
        reader = read_config if kind == "configMap" else read_secret
        data = reader(namespace, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise SourceMissing(f"{where}: {kind} {ref['name']!r} not found")
        items = ref.get("items")
        if items:
            for item in items:
                if item["key"] not in data:
                    raise SourceMissing(
                        f"{where}: {kind} {ref['name']!r} has no key {item['key']!r}"
                    )
                files[item["path"]] = data[item["key"]]
        else:
            files.update(data)
    return files


def container_mounts(
    container: Mapping[str, Any], sources: Mapping[str, VolumeSource]
) -> list[Mount]:
    """The container's volumeMounts resolved against the pod's volume sources."""
    mounts = []
    for index, mount in enumerate(container.get("volumeMounts") or []):
        where = f"containers[{container.get('name')}].volumeMounts[{index}]"
        source = sources.get(mount["name"])
        if source is None:
            raise PodSpecError(f"{where}: no volume named {mount['name']!r}")
        target = mount["mountPath"]
        if not target.startswith("/"):
            raise PodSpecError(f"{where}.mountPath must be absolute, got {target!r}")
        read_only = bool(mount.get("readOnly")) or source.kind == "files"
        if source.kind == "tmpfs":
            mounts.append(Mount(target, None, read_only, source.tmpfs_size))
            continue
        assert source.path is not None
        path = source.path
        sub_path = mount.get("subPath")
        if sub_path:
            if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                raise PodSpecError(f"{where}.subPath must be relative, got {sub_path!r}")
            path = str(Path(path) / sub_path)
        mounts.append(Mount(target, path, read_only))
    return mounts


def container_launch(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    env: Mapping[str, str],
    sources: Mapping[str, VolumeSource],
    default_working_dir: str,
) -> ContainerLaunch:
    """What one container runs: command + args with ``$(VAR)`` expanded."""
    name = container.get("name", "")
    argv = [expand_refs(str(a), env) for a in (container.get("command") or [])]
    argv += [expand_refs(str(a), env) for a in (container.get("args") or [])]
    if not argv:
        raise PodSpecError(
            f"containers[{name}]: the node agent runs no images, so command (or args) must be set"
        )
    return ContainerLaunch(
        name=name,
        argv=argv,
        env=dict(env),
        working_dir=container.get("workingDir") or default_working_dir,
        mounts=container_mounts(container, sources),
        limits=container_limits(container),
    )
