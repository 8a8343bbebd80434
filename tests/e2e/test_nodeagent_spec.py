"""The node agent's pure parts: pod -> processes, /etc/hosts, phases."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import e2e  # noqa: F401  (puts dev/ on the path)

from nodeagent import podspec, runtime  # isort: skip
from nodeagent.hosts import PeerAddress, peer_from_pod, render_hosts  # isort: skip
from nodeagent.pod import phase_of  # isort: skip

POD = {
    "metadata": {
        "name": "job-worker-0",
        "namespace": "team",
        "uid": "u-1",
        "labels": {"role": "worker"},
        "annotations": {"note": "x"},
    },
    "spec": {"nodeName": "tf-local-1", "hostname": "job-worker-0", "subdomain": "job"},
    "status": {"podIP": "10.250.2.5", "hostIP": "10.250.0.1"},
}


def no_objects(*_args: str) -> None:
    return None


def env_of(container: dict, base: dict | None = None, configs: dict | None = None) -> dict:
    configs = configs or {}

    def read(namespace: str, name: str) -> dict | None:
        return configs.get((namespace, name))

    def lookup(namespace: str, name: str, key: str) -> str | None:
        return (read(namespace, name) or {}).get(key)

    return podspec.container_env(POD, container, base or {}, lookup, lookup, read, read)


@pytest.mark.parametrize(
    ("field_path", "expected"),
    [
        ("metadata.name", "job-worker-0"),
        ("metadata.namespace", "team"),
        ("metadata.uid", "u-1"),
        ("spec.nodeName", "tf-local-1"),
        ("status.podIP", "10.250.2.5"),
        ("status.hostIP", "10.250.0.1"),
        ("metadata.labels['role']", "worker"),
        ("metadata.annotations['note']", "x"),
        ("metadata.labels['absent']", ""),
    ],
)
def test_field_refs(field_path, expected):
    assert podspec.field_ref_value(POD, field_path) == expected


def test_unsupported_field_ref_is_named():
    with pytest.raises(podspec.PodSpecError, match=r"status\.phase"):
        podspec.field_ref_value(POD, "status.phase")


def test_env_order_expansion_and_sources():
    container = {
        "name": "trainer",
        "envFrom": [{"configMapRef": {"name": "common"}, "prefix": "CM_"}],
        "env": [
            {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "ADDR", "value": "$(ME).$(SVC):$(PORT)"},
            {"name": "LITERAL", "value": "$$(ME)"},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "common", "key": "level"}}},
        ],
    }
    env = env_of(container, {"PATH": "/bin", "SVC": "job"}, {("team", "common"): {"level": "3"}})
    assert env == {
        "PATH": "/bin",
        "SVC": "job",
        "CM_level": "3",
        "ME": "job-worker-0",
        # Unknown references stay as written, as the kubelet leaves them.
        "ADDR": "job-worker-0.job:$(PORT)",
        "LITERAL": "$(ME)",
        "LEVEL": "3",
    }


def test_missing_config_key_names_the_variable():
    container = {
        "name": "trainer",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}],
    }
    with pytest.raises(podspec.SourceMissing, match=r"env\[0\] \(X\)") as missing:
        env_of(container)
    # The kubelet retries it: the pod waits, its container CreateContainerConfigError.
    assert missing.value.reason == "CreateContainerConfigError"


def test_volumes_map_to_local_places(tmp_path: Path):
    pod = {
        **POD,
        "spec": {
            **POD["spec"],
            "volumes": [
                {"name": "ckpt", "persistentVolumeClaim": {"claimName": "job-checkpoint"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "c", "items": [{"key": "a", "path": "x/a"}]}},
            ],
        },
    }

    def read(namespace: str, name: str) -> dict | None:
        return {"a": "alpha", "b": "beta"} if (namespace, name) == ("team", "c") else None

    sources = podspec.volume_sources(
        pod, tmp_path / "pod", lambda ns, claim: tmp_path / "claims" / ns / claim, read, read
    )
    assert sources["ckpt"] == podspec.VolumeSource(
        "dir", str(tmp_path / "claims/team/job-checkpoint")
    )
    assert sources["dshm"] == podspec.VolumeSource("tmpfs", tmpfs_size=str(2**30))
    assert sources["scratch"] == podspec.VolumeSource("dir", str(tmp_path / "pod/volumes/scratch"))
    assert sources["cfg"].files == {"x/a": "alpha"}

    container = {
        "name": "trainer",
        "volumeMounts": [
            {"name": "ckpt", "mountPath": "/ckpt", "subPath": "run1"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "cfg", "mountPath": "/etc/cfg"},
        ],
    }
    assert podspec.container_mounts(container, sources) == [
        podspec.Mount("/ckpt", str(tmp_path / "claims/team/job-checkpoint/run1")),
        podspec.Mount("/dev/shm", None, tmpfs_size=str(2**30)),
        podspec.Mount("/etc/cfg", str(tmp_path / "pod/volumes/cfg"), read_only=True),
    ]


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        ({"name": "v", "nfs": {"server": "s", "path": "/"}}, r"volumes\[0\] \(v\).*nfs"),
        ({"name": "v", "emptyDir": {"sizeLimit": "lots", "medium": "Memory"}}, "sizeLimit"),
        ({"name": "v", "configMap": {"name": "absent"}}, "configMap 'absent' not found"),
    ],
)
def test_bad_volumes_are_named(tmp_path: Path, volume, message):
    pod = {**POD, "spec": {**POD["spec"], "volumes": [volume]}}
    with pytest.raises(podspec.PodSpecError, match=message):
        podspec.volume_sources(pod, tmp_path, lambda ns, c: tmp_path, no_objects, no_objects)


def test_mount_of_unknown_volume_and_escaping_subpath_are_rejected():
    sources = {"v": podspec.VolumeSource("dir", "/data")}
    with pytest.raises(podspec.PodSpecError, match="no volume named 'w'"):
        podspec.container_mounts(
            {"name": "c", "volumeMounts": [{"name": "w", "mountPath": "/w"}]}, sources
        )
    with pytest.raises(podspec.PodSpecError, match="subPath"):
        podspec.container_mounts(
            {"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/w", "subPath": "../x"}]},
            sources,
        )


def test_launch_needs_a_command_and_expands_args():
    env = {"STEPS": "10"}
    launch = podspec.container_launch(
        POD, {"name": "t", "command": ["train"], "args": ["--steps=$(STEPS)"]}, env, {}, "/w"
    )
    assert launch.argv == ["train", "--steps=10"]
    assert launch.working_dir == "/w"
    with pytest.raises(podspec.PodSpecError, match="command"):
        podspec.container_launch(POD, {"name": "t", "image": "x"}, env, {}, "/w")


def test_hosts_file_has_every_form_of_each_peers_name():
    own = PeerAddress("team", "job-worker-0", "job", "10.250.2.5")
    master = PeerAddress("team", "job-master-0", "job", "10.250.1.2")
    elsewhere = PeerAddress("other", "x-master-0", "x", "10.250.1.9")
    hosts = render_hosts(own, [own, master, elsewhere])
    entries = [line.split("\t") for line in hosts.splitlines()[1:]]
    # The first line for an address holds its pod's own names.
    lines: dict[str, list[str]] = {}
    for ip, *names in entries:
        lines.setdefault(ip, names)

    assert lines["10.250.1.2"] == [
        "job-master-0.job.team.svc.cluster.local",
        "job-master-0.job.team.svc",
        "job-master-0.job.team",
        "job-master-0.job",
    ]
    # Another namespace's pod has no short form here.
    assert lines["10.250.1.9"] == [
        "x-master-0.x.other.svc.cluster.local",
        "x-master-0.x.other.svc",
        "x-master-0.x.other",
    ]
    assert "job-worker-0" in lines["10.250.2.5"]
    # The headless Service's own name lists every pod of the job.
    service_ips = {ip for ip, *names in entries if "job.team.svc" in names}
    assert service_ips == {"10.250.1.2", "10.250.2.5"}


def test_terminating_and_finished_pods_give_up_their_names():
    running = {**POD, "status": {"podIP": "10.250.2.5", "phase": "Running"}}
    finished = {**POD, "status": {"podIP": "10.250.2.5", "phase": "Failed"}}
    deleting = {**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert peer_from_pod(running) == PeerAddress("team", "job-worker-0", "job", "10.250.2.5")
    assert peer_from_pod(finished) is None
    assert peer_from_pod(deleting) is None


@pytest.mark.parametrize(
    ("policy", "codes", "initialized", "phase"),
    [
        ("Never", [None, 0], True, "Running"),
        ("Never", [0, 0], True, "Succeeded"),
        ("Never", [0, 137], True, "Failed"),
        ("OnFailure", [0, 1], True, "Running"),
        ("OnFailure", [0, 0], True, "Succeeded"),
        ("Always", [0], True, "Running"),
        ("Never", [None], False, "Pending"),
    ],
)
def test_phase_follows_exit_codes_and_restart_policy(policy, codes, initialized, phase):
    assert phase_of(policy, codes, initialized) == phase


def test_pods_resolve_host_names_from_files_only():
    host = "passwd:         files\nhosts:          files dns myhostname\nnetworks:       files\n"
    assert runtime.files_only_nsswitch(host) == (
        "passwd:         files\nhosts:          files\nnetworks:       files\n"
    )
    assert "hosts:          files" in runtime.files_only_nsswitch("passwd: files\n")


def test_container_env_flags_reach_every_container_and_bad_ones_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from nodeagent.__main__ import parse_args
    from nodeagent.agent import AgentConfig, base_env

    required = ["--kubeconfig", "k", "--state-dir", "s"]
    args = parse_args([*required, "--container-env", "PYTHONPATH=/a:/b=c"])
    config = AgentConfig("k", ["n"], Path("s"), extra_env=dict(args.container_env))
    assert base_env(config)["PYTHONPATH"] == "/a:/b=c"
    with pytest.raises(SystemExit):
        parse_args([*required, "--container-env", "NOVALUE"])
    assert "expected NAME=VALUE, got 'NOVALUE'" in capsys.readouterr().err
