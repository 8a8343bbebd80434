"""Least privilege for the paths only real training drives: the e2e operator
runs as the chart's ServiceAccount too (tests/fixtures/e2e.py), so after every
other e2e test the same audit-log judgement as the cluster tier's
(tests/cluster/test_least_privilege.py) covers the in-place restarts, the
straggler Replace, the silent node's force-delete, Kueue preemption and the
elastic membership changes: no Secret, no refusal, no verb the chart does not
grant, no write outside a job's namespace."""

from __future__ import annotations

import pytest

from tests.cluster.test_least_privilege import (
    test_the_operator_used_only_what_the_chart_grants_and_never_a_secret as judged_by_the_audit_log,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.after_every_other_test]


def test_the_e2e_operator_used_only_what_the_chart_grants_and_never_a_secret(
    cluster, chart_identity, e2e_operator
):
    judged_by_the_audit_log(cluster, chart_identity)
