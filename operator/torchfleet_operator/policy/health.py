"""The node-health policy: stragglers, the preflight check and hung gangs. Pure.

In a synchronous gang one slow node (a throttled GPU, a hot or degraded host)
makes every rank wait for it, and a rank stuck on a dead peer makes the whole
gang "hang" on nodes that are up. torchfleet-train measures each node's compute
time apart from its waits (trainer health.py) and exports it per node with the
gang's phase; this policy reads them from the master's scrape
(status/node_health.py) while the gang runs and decides:

* ``status.health``: per node of the current gang, its figures and the
  consecutive log intervals ("windows") its straggler score was above
  ``runPolicy.stragglers.threshold``. A window is counted when the figures
  change (the trainer sets them once per log interval), never per scrape.
* ``Straggler``: True naming the nodes slow for ``windows`` in a row, with
  their scores; False once every node is back under the threshold.
* ``Preflight``: the trainer's check of a new gang: True when every node
  passed, False naming a node below its matmul fraction.
* ``Stalled``: True when the step has stood still for longer than
  ``runPolicy.stall`` allows while the trainer says it trains (a long
  evaluation or checkpoint save is its own phase, so never a hang).
* ``DeviceUnhealthy``: True naming the devices the kubelet reports Unhealthy
  for a running pod of the gang (its containers' ``allocatedResourcesStatus``,
  KEP-4680: the device plugin's word, e.g. a GPU fallen off the bus); False
  once none is. Read from the pods, so it holds for any program, the
  trainer's or a user's own.

Under ``stragglers.action: Replace`` a slow node (straggler or preflight), or
the node of an unhealthy device, is
added to ``status.health.avoidedNodes`` (the job's next pods carry a node
affinity that keeps them off it: desired/pods.py) and the gang restarts, as a
disruption: the node, not the program, is at fault. A disruption counts
toward no limit, so Replace has its own, ``stragglers.maxReplacements`` over
the job's life (``status.health.replacements``): once spent, a slow node is only
reported, and its condition says so. Under ``stall.action:
Restart`` a stalled gang restarts as a failure of the program, counted toward
backoffLimit (a deadlock would otherwise restart for ever). Either restart is
the failure policy's (policy/failure.py), which this returns failures for.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from torchfleet_contract import pod as contract
from torchfleet_operator.api import constants as c
from torchfleet_operator.api import reasons as r
from torchfleet_operator.api.parse import wire
from torchfleet_operator.api.v1alpha1 import HealthStatus, TrainingJobSpec
from torchfleet_operator.desired.names import MASTER_ROLE
from torchfleet_operator.observed import GangHealth, NodeFigures, ObservedPod, parse_time, timestamp
from torchfleet_operator.planning import Pass
from torchfleet_operator.policy import reporting
from torchfleet_operator.policy.failure import Failure
from torchfleet_operator.status.restarts import count_of, limit_reached
from torchfleet_operator.status.restarts import gang as gang_generation

# Figures are kept to this many decimals in the status (and compared so).
DIGITS = 6
# The failures of a Replace restart (spending runPolicy.stragglers.maxReplacements).
REPLACE_REASONS = (r.REASON_SLOW_NODE, r.REASON_PREFLIGHT_SLOW_NODE, r.REASON_UNHEALTHY_DEVICE)
# Phases in which a still step counter is expected: the gang is not training.
NOT_TRAINING = (
    contract.PHASE_STARTING,
    contract.PHASE_PREFLIGHT,
    contract.PHASE_EVAL,
    contract.PHASE_CHECKPOINT,
    contract.PHASE_DONE,
)


def judge(step: Pass, spec: TrainingJobSpec, gang: list[ObservedPod]) -> list[Failure]:
    """Records the running gang's node health and its conditions; returns the
    failures that restart it (Replace, Restart), none under Report."""
    restart = gang_generation(step.status)
    health = _for_gang(step, restart)
    running = step.old_status.phase == c.PHASE_RUNNING
    latest = step.observed.health if running else None
    # A device the kubelet gave up on comes first: it is the plugin's finding,
    # not a figure's, and the node's other findings are likely its effects.
    found = _devices(step, spec, health, gang)
    # Figures count only from the scrape status.progress shows (this gang's, and
    # each log interval once); the phase is read from the latest scrape, which
    # a pass may refuse as progress only for being taken in the same second.
    if latest is not None and latest.nodes and reporting.scrape_is_shown(step):
        nodes = _nodes(step, spec, health, latest, gang)
        found += _stragglers(step, spec, health, nodes, gang)
        found += _preflight(step, spec, health, nodes, gang)
    if running:
        found += _stall(step, spec, health, latest, gang)
    if found and found[0].reason in REPLACE_REASONS:
        health["replacements"] = _replacements(health) + 1  # one restart, however many nodes
    if set(health) != {"gang"} or step.status.health is not None:
        # None for a job that never reported any.
        step.status.health = HealthStatus.model_validate(health)
    return found[:1]  # one restart; the first reason names it


def _warn(step: Pass, type_: str, bad: bool, reason: str, message: str) -> None:
    """Sets the condition to its bad status (True, or False for Preflight), with a
    Warning event when it turns so or its reason changes: one per finding, not
    one per pass."""
    shown = step.condition(type_)
    was = (shown.status, shown.reason) if shown is not None else (None, None)
    newly = was != ("True" if bad else "False", reason)
    step.set_condition(type_, bad, reason, message)
    if newly:
        step.event("Warning", reason, message)


# ---- the record ----


def _for_gang(step: Pass, restart: int) -> dict[str, Any]:
    """status.health for gang ``restart``: the avoided nodes always carry over;
    the figures and the step clock are the gang's own."""
    shown = wire(step.status.health) if step.status.health is not None else {}
    if shown.get("gang") == restart:
        return shown
    kept: dict[str, Any] = {"gang": restart}
    if shown.get("avoidedNodes"):
        kept["avoidedNodes"] = list(shown["avoidedNodes"])
    if _replacements(shown):
        kept["replacements"] = _replacements(shown)
    if step.is_true(r.CONDITION_STALLED):
        step.clear_condition(r.CONDITION_STALLED, r.REASON_STEP_MOVING, f"gang {restart} started")
    return kept


def _node_name(label: str, gang: list[ObservedPod]) -> str:
    """The Kubernetes node a figure is of: the trainer names its node by
    $TORCHFLEET_NODE_NAME, or else by its host name, which is its pod's name."""
    pod = next((p for p in gang if p.name == label and p.node_name), None)
    return pod.node_name if pod is not None and pod.node_name else label


def _per_node(scraped: GangHealth, gang: list[ObservedPod]) -> dict[str, NodeFigures]:
    """The figures by Kubernetes node: where two pods of the gang share a node,
    the node is as slow as its slowest (the trainer reports each pod as a node)."""
    by_node: dict[str, NodeFigures] = {}
    for figures in scraped.nodes:
        name = _node_name(figures.node, gang)
        known = by_node.get(name)
        if known is None or (figures.straggler_score or 0) > (known.straggler_score or 0):
            by_node[name] = figures
    return by_node


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, DIGITS)


def _nodes(
    step: Pass,
    spec: TrainingJobSpec,
    health: dict[str, Any],
    scraped: GangHealth,
    gang: list[ObservedPod],
) -> list[dict[str, Any]]:
    """status.health.nodes from the scrape: a new window (new figures) adds one
    to a slow node's count and resets a node back under the threshold."""
    threshold = spec.run_policy.stragglers.threshold
    before = {n.get("node"): n for n in health.get("nodes") or () if isinstance(n, dict)}
    by_node = _per_node(scraped, gang)
    new_window = [(n.get("node"), n.get("computeSeconds")) for n in before.values()] != [
        (name, _rounded(f.compute_seconds)) for name, f in by_node.items()
    ]
    nodes = []
    for name, figures in by_node.items():
        slow = int((before.get(name) or {}).get("slowWindows") or 0)
        if new_window and figures.straggler_score is not None:
            slow = slow + 1 if figures.straggler_score > threshold else 0
        nodes.append(_node_status(name, figures, slow))
    health["nodes"] = nodes
    return nodes


def _node_status(name: str, figures: NodeFigures, slow: int) -> dict[str, Any]:
    shown: dict[str, Any] = {"node": name, "slowWindows": slow}
    optional = {
        "nodeRank": figures.node_rank,
        "computeSeconds": _rounded(figures.compute_seconds),
        "stragglerScore": _rounded(figures.straggler_score),
        "preflightRatio": _rounded(figures.preflight_ratio),
        "preflightPassed": figures.preflight_passed,
    }
    return shown | {k: v for k, v in optional.items() if v is not None}


# ---- stragglers ----


def _stragglers(
    step: Pass,
    spec: TrainingJobSpec,
    health: dict[str, Any],
    nodes: list[dict[str, Any]],
    gang: list[ObservedPod],
) -> list[Failure]:
    policy = spec.run_policy.stragglers
    slow = [n for n in nodes if n["slowWindows"] >= policy.windows]
    if not slow:
        if all("stragglerScore" in n for n in nodes):
            step.clear_condition(
                r.CONDITION_STRAGGLER,
                r.REASON_NODES_EVEN,
                f"every node is within {policy.threshold:g}x the median node's compute time",
            )
        return []
    slow.sort(key=lambda n: -float(n.get("stragglerScore") or 0))
    named = "; ".join(
        f"node {n['node']} computes {float(n.get('stragglerScore') or 0):.2f}x the median "
        f"node's time per step ({n.get('computeSeconds')} s)"
        for n in slow[:5]
    )
    message = (
        f"{named}, above runPolicy.stragglers.threshold {policy.threshold:g} for "
        f"{policy.windows} log intervals in a row"
    )
    replace, reason, message = _replacing(
        spec, health, r.REASON_SLOW_NODE, message, "the gang restarts away from it (action Replace)"
    )
    _warn(step, r.CONDITION_STRAGGLER, True, reason, message)
    if not replace:
        return []
    return _replace(step, health, [n["node"] for n in slow], gang, r.REASON_SLOW_NODE, message)


def _replacements(health: dict[str, Any]) -> int:
    """status.health.replacements, as a count (the status is read back from the API)."""
    return count_of(health.get("replacements"))


def _replacing(
    spec: TrainingJobSpec, health: dict[str, Any], reason: str, message: str, restarts: str
) -> tuple[bool, str, str]:
    """(whether the gang restarts away from the node, the condition's reason, its
    message): under Replace while runPolicy.stragglers.maxReplacements is not spent."""
    policy = spec.run_policy.stragglers
    if policy.action != "Replace":
        return False, reason, message
    done = _replacements(health)
    if limit_reached(done + 1, policy.max_replacements):
        return (
            False,
            r.REASON_MAX_REPLACEMENTS_REACHED,
            f"{message}; only reported: runPolicy.stragglers.maxReplacements "
            f"{policy.max_replacements} spent ({done} Replace restarts)",
        )
    return True, reason, f"{message}; {restarts}"


def _replace(
    step: Pass,
    health: dict[str, Any],
    nodes: list[str],
    gang: list[ObservedPod],
    reason: str,
    message: str,
) -> list[Failure]:
    """Avoids ``nodes`` from the next gang on; the failure (a disruption) that
    restarts this one. Only nodes a pod of the gang runs on: a name the trainer
    made up is no node to avoid."""
    on_gang = [n for n in nodes if any(p.node_name == n for p in gang)]
    if not on_gang:
        return []
    avoided = [n for n in health.get("avoidedNodes") or () if n not in on_gang] + on_gang
    health["avoidedNodes"] = avoided[-c.MAX_AVOIDED_NODES :]
    pod = next(p for p in gang if p.node_name == on_gang[0])
    return [Failure(pod.name, reason, None, True, message, disruption=True)]


# ---- devices ----


def _devices(
    step: Pass, spec: TrainingJobSpec, health: dict[str, Any], gang: list[ObservedPod]
) -> list[Failure]:
    running = [p for p in gang if not p.finished and not p.deleting]
    bad = [(pod, device) for pod in running for device in pod.unhealthy_devices]
    if not bad:
        step.clear_condition(
            r.CONDITION_DEVICE_UNHEALTHY,
            r.REASON_DEVICES_HEALTHY,
            "the kubelet reports no device of the gang's pods unhealthy",
        )
        return []
    named = "; ".join(
        f"{device} of pod {pod.name} on node {pod.node_name or 'unknown'}"
        for pod, device in bad[:5]
    )
    replace, reason, message = _replacing(
        spec,
        health,
        r.REASON_UNHEALTHY_DEVICE,
        f"the kubelet reports {named} unhealthy",
        "the gang restarts away from its node (runPolicy.stragglers.action Replace)",
    )
    _warn(step, r.CONDITION_DEVICE_UNHEALTHY, True, reason, message)
    if not replace:
        return []
    nodes = list(dict.fromkeys(pod.node_name for pod, _ in bad if pod.node_name))
    return _replace(step, health, nodes, gang, r.REASON_UNHEALTHY_DEVICE, message)


# ---- preflight ----


def _preflight(
    step: Pass,
    spec: TrainingJobSpec,
    health: dict[str, Any],
    nodes: list[dict[str, Any]],
    gang: list[ObservedPod],
) -> list[Failure]:
    checked = [n for n in nodes if "preflightPassed" in n]
    if not checked:
        return []
    failed = [n for n in checked if not n["preflightPassed"]]
    ratios = [float(n.get("preflightRatio") or 0) for n in checked]
    if not failed:
        step.set_condition(
            r.CONDITION_PREFLIGHT,
            True,
            r.REASON_PREFLIGHT_PASSED,
            f"{len(checked)} nodes passed: matmul throughput {min(ratios):.2f}-"
            f"{max(ratios):.2f}x the median node's",
        )
        return []
    message = "; ".join(
        f"node {n['node']} reached {float(n.get('preflightRatio') or 0):.2f}x the median "
        "node's matmul throughput"
        for n in failed[:5]
    )
    fraction = spec.trainer.preflight.min_matmul_fraction if spec.trainer else None
    if fraction is not None:
        message += f", below trainer.preflight.minMatmulFraction {fraction:g}"
    replace, reason, message = _replacing(
        spec,
        health,
        r.REASON_PREFLIGHT_SLOW_NODE,
        message,
        "the gang restarts away from it (runPolicy.stragglers.action Replace)",
    )
    _warn(step, r.CONDITION_PREFLIGHT, False, reason, message)
    if not replace:
        return []
    names = [n["node"] for n in failed]
    return _replace(step, health, names, gang, r.REASON_PREFLIGHT_SLOW_NODE, message)


def collectives_failed(step: Pass, found: list[Failure], gang: list[ObservedPod]) -> None:
    """The Preflight condition when the gang ends because a collective of the
    trainer's preflight check failed or timed out (its own exit code): the nodes
    of the pods that said so. The failure policy restarts the gang as usual."""
    failed = [f for f in found if f.exit_code == contract.EXIT_PREFLIGHT_FAILED]
    if not failed:
        return
    nodes = {p.name: p.node_name for p in gang}
    named = ", ".join(f"{f.pod} (node {nodes.get(f.pod) or 'unknown'})" for f in failed[:5])
    message = (
        f"a collective of the preflight check failed or timed out on {named} (exit code "
        f"{contract.EXIT_PREFLIGHT_FAILED}): a node or link of this gang, not the program"
    )
    _warn(step, r.CONDITION_PREFLIGHT, False, r.REASON_PREFLIGHT_COLLECTIVE_FAILED, message)


# ---- a step counter that stands still ----


def _stall(
    step: Pass,
    spec: TrainingJobSpec,
    health: dict[str, Any],
    scraped: GangHealth | None,
    gang: list[ObservedPod],
) -> list[Failure]:
    progress = step.status.progress
    if progress is None or "step" not in progress.model_fields_set:
        return []
    number = progress.step
    seen = health.get("stepSeen")
    if not isinstance(seen, dict) or seen.get("step") != number:
        since = progress.update_time or step.now
        health["stepSeen"] = {"step": number, "since": timestamp(min(since, step.now))}
        step.clear_condition(
            r.CONDITION_STALLED, r.REASON_STEP_MOVING, f"the step moved on to {number}"
        )
        return []
    phase = scraped.phase if scraped is not None else None
    if phase in NOT_TRAINING:
        return []  # a still step is expected; a scrape in the next phase brings a pass
    stood, limit, why = _stood_still(step, spec, seen, scraped)
    if stood < limit:
        step.plan.wake_in(limit - stood)
        return []
    policy = spec.run_policy.stall
    message = f"step {number} has not moved for {stood:.0f}s while the gang trains ({why})" + (
        "; the gang restarts (runPolicy.stall.action Restart)" if policy.action == "Restart" else ""
    )
    _warn(step, r.CONDITION_STALLED, True, r.REASON_STEP_STALLED, message)
    if policy.action != "Restart":
        return []
    master = next((p for p in gang if p.role == MASTER_ROLE), gang[0] if gang else None)
    if master is None:
        return []
    return [Failure(master.name, r.REASON_STEP_STALLED, None, True, message)]


def _stood_still(
    step: Pass, spec: TrainingJobSpec, seen: dict[str, Any], scraped: GangHealth | None
) -> tuple[float, float, str]:
    """(seconds the step has stood still while training, the limit, the limit's why)."""
    policy = spec.run_policy.stall
    since = parse_time(seen.get("since")) or step.now
    started = scraped.phase_started if scraped is not None else None
    if scraped is not None and scraped.phase == contract.PHASE_TRAIN and started is not None:
        # Back in the train phase after an evaluation or a save: count from there.
        try:
            phase_began = datetime.fromtimestamp(started, UTC)
        except (OverflowError, OSError, ValueError):
            phase_began = since
        since = max(since, min(phase_began, step.now))
    stood = (step.now - since).total_seconds()
    mean = scraped.step_seconds if scraped is not None else None
    if mean is None:
        return (
            stood,
            float(policy.min_seconds),
            f"limit runPolicy.stall.minSeconds {policy.min_seconds}s",
        )
    by_steps = policy.step_time_multiple * mean
    limit = max(float(policy.min_seconds), by_steps)
    why = (
        f"limit {limit:.0f}s: {policy.step_time_multiple:g}x the mean step time {mean:.3g}s, "
        f"at least runPolicy.stall.minSeconds {policy.min_seconds}s"
    )
    return stood, limit, why
