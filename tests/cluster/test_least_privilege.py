"""Least privilege, shown by the API server: after every other test of the
session, the audit log says what the operator did as the chart's
ServiceAccount (the identity the shared operator runs as, with the chart's
RBAC only: tests/fixtures/chart_identity.py). It never touched a Secret, was
never refused, used no verb the chart does not grant, and wrote only in
namespaces that held a TrainingJob (Leases are not in the log: the policy
leaves heartbeats out)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.fixtures.cluster import audit_events, audit_log

pytestmark = [pytest.mark.cluster, pytest.mark.after_every_other_test]

AUTHORIZATION = "authorization.k8s.io/decision"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def _resource(event: dict[str, Any]) -> tuple[str, str]:
    """(apiGroup, resource[/subresource]) of an audit event."""
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return ref.get("apiGroup", ""), resource


def _job_namespaces(cluster: Any) -> set[str]:
    """Namespaces a TrainingJob was created in this session, by anyone."""
    path = audit_log(cluster)
    assert path is not None
    marker = '"resource":"trainingjobs"'
    found = set()
    for line in path.read_text().splitlines():
        if marker in line and '"verb":"create"' in line:
            event = json.loads(line)
            if event.get("objectRef", {}).get("subresource") is None:
                found.add(event["objectRef"].get("namespace"))
    return found


def test_the_operator_used_only_what_the_chart_grants_and_never_a_secret(
    cluster: Any, chart_identity: Any
) -> None:
    if audit_log(cluster) is None:
        pytest.skip("another cluster's API server audit log is not ours to read")
    events = [
        e
        for e in audit_events(cluster, chart_identity.username)
        if e.get("stage") == "ResponseComplete" and e.get("objectRef")
    ]
    assert events, (
        f"the audit log holds no request of {chart_identity.username}: a local cluster started "
        "by an older checkout, whose audit policy left service accounts out? Stop it "
        "(dev/cluster/localcluster.py down) and run again"
    )
    secrets = [e for e in events if _resource(e)[1].startswith("secrets")]
    assert not secrets, f"the operator touched Secrets: {secrets[:3]}"

    # The authorizer's own verdict: a 403 may also be admission's (a namespace
    # being deleted at a test's end refuses new content), which RBAC allowed.
    refused = [e for e in events if (e.get("annotations") or {}).get(AUTHORIZATION) != "allow"]
    assert not refused, "the chart's RBAC refused the operator: " + "; ".join(
        f"{e['verb']} {_resource(e)} in {e['objectRef'].get('namespace')}" for e in refused[:5]
    )

    used = Counter((e["verb"], *_resource(e)) for e in events)
    # The shared operator ran every cluster module's jobs: far more than a handful.
    assert sum(used.values()) > 50 and any(v == "create" for v, _, _ in used), used
    granted = chart_identity.granted()
    ungranted = {use for use in used if use not in granted and (use[0], use[1], "*") not in granted}
    assert not ungranted, f"verbs the chart does not grant: {sorted(ungranted)}"

    jobs = _job_namespaces(cluster)
    astray = Counter(
        (e["verb"], _resource(e)[1], e["objectRef"].get("namespace"))
        for e in events
        if e["verb"] in WRITES and e["objectRef"].get("namespace") not in jobs
    )
    assert not astray, f"writes outside the namespaces of its jobs: {dict(astray)}"
