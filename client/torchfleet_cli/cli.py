"""The ``torchfleet`` command (also ``kubectl torchfleet``): run, attach, ls,
describe, logs, delete. kubectl's conventions: ``KUBECONFIG``, ``--context``,
``-n/--namespace`` on every verb, ``-o yaml|json`` on listings.

Argument parsing and terminal drawing only (click, rich); the verbs' work is
the client's (client.py), the words shown are progress.py's.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from torchfleet_cli import manifest, progress
from torchfleet_cli.client import Client, Job, JobNotFound, KeptLogNotRead
from torchfleet_cli.kept_logs import NoKeptLogs
from torchfleet_cli.packing import PackingError
from torchfleet_operator.api import InvalidSpecError, TrainingJobStatus
from torchfleet_operator.api.constants import PHASE_SUCCEEDED
from torchfleet_operator.api.parse import read_status

# Exit status of a detached `run` or `attach` (Ctrl-C), as a shell's for SIGINT.
EXIT_DETACHED = 130
POLL_SECONDS = 1.0
# How long a followed job's last log lines may take to arrive once it ended.
LOG_DRAIN_SECONDS = 10.0

F = TypeVar("F", bound=Callable[..., Any])


class ProcsPerNode(click.ParamType):
    """A positive integer or ``gpu`` (one process per GPU)."""

    name = "N|gpu"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) or value == "gpu":
            return value
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            self.fail(f"{value!r} is neither a positive integer nor 'gpu'", param, ctx)
        return number


def kube_options(command: F) -> F:
    """kubectl's connection flags, accepted after every verb."""

    @click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (as kubectl's).")
    @click.option("--context", help="Kubeconfig context to use.")
    @click.option("-n", "--namespace", help="Namespace (default: the context's).")
    @functools.wraps(command)
    def wrapped(
        kubeconfig: str | None, context: str | None, namespace: str | None, **kwargs: Any
    ) -> Any:
        return command(
            lambda: Client(kubeconfig=kubeconfig, context=context, namespace=namespace),
            **kwargs,
        )

    return wrapped  # type: ignore[return-value]


def log_options(command: F) -> F:
    """Which log a followed job shows above its bar."""
    command = click.option(
        "--rank",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Show this node rank's log (0: the master's).",
    )(command)
    return click.option("--no-logs", is_flag=True, help="Show the progress bar only.")(command)


def output_option(command: F) -> F:
    return click.option(
        "-o", "--output", type=click.Choice(["yaml", "json"]), help="Print the objects as is."
    )(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Run your own training script on Kubernetes as a torchfleet TrainingJob."""


def main() -> None:
    """The console scripts' entry: the API server's refusals read as kubectl's.

    Once the command has done its work the process ends at once: its output
    flushed and the exit handlers run (the Kubernetes client's removes the CA
    files it wrote), but not the interpreter's teardown. A thread following a
    pod's log may still be blocked reading from the API server then, and a
    daemon thread woken during the teardown can abort the process (SIGABRT,
    exit -6 instead of 130, seen after Ctrl-C under load) after everything the
    command had to do, `run --rm`'s delete included, was done."""
    code = _run()
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def _run() -> int:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException

    try:
        cli(prog_name="torchfleet")
    except SystemExit as exit_:
        return _exit_code(exit_.code)
    except ApiException as error:
        click.echo(f"Error from server ({error.reason}): {_server_message(error)}", err=True)
        return 1
    except ConfigException as error:
        click.echo(f"error: no cluster to talk to: {error}", err=True)
        return 1
    return 0


def _exit_code(code: object) -> int:
    """sys.exit's argument as the process's status (a message: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    click.echo(code, err=True)
    return 1


def _server_message(error: Any) -> str:
    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.body or error)


@cli.command(context_settings={"show_default": True})
@click.argument("script_or_folder", type=click.Path(exists=True))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--nodes", type=click.IntRange(min=1), default=1, help="Pods (one per node).")
@click.option(
    "--procs-per-node", type=ProcsPerNode(), default="1", help="Processes per pod, or 'gpu'."
)
@click.option("--gpus", type=click.IntRange(min=0), default=0, help="GPUs per pod.")
@click.option(
    "--runtime",
    metavar="[KIND/]NAME",
    help="The runtime the job takes its image, pod templates and scheduling from: a "
    "ClusterTrainingRuntime, or TrainingRuntime/NAME for the namespace's own.",
)
@click.option(
    "--image",
    help=f"Container image with torch [default: the runtime's, else {manifest.DEFAULT_IMAGE}].",
)
@click.option("--name", help="Job name (default: the script's name and a random suffix).")
@click.option("--entry", help="A folder's script to run (default: train.py).")
@click.option(
    "--node-selector",
    multiple=True,
    metavar="KEY=VALUE",
    help="Run only on nodes with this label (repeatable).",
)
@click.option(
    "--toleration",
    multiple=True,
    metavar="KEY=VALUE:EFFECT",
    help="Tolerate this taint (repeatable; KEY:EFFECT for any value).",
)
@click.option("--detach", is_flag=True, help="Create the job and return at once.")
@click.option(
    "--rm", "remove", is_flag=True, help="Delete the job when the command ends (Ctrl-C too)."
)
@log_options
@kube_options
def run(
    connect: Callable[[], Client],
    script_or_folder: str,
    args: tuple[str, ...],
    nodes: int,
    procs_per_node: int | str,
    gpus: int,
    runtime: str | None,
    image: str | None,
    name: str | None,
    entry: str | None,
    node_selector: tuple[str, ...],
    toleration: tuple[str, ...],
    detach: bool,
    remove: bool,
    rank: int,
    no_logs: bool,
) -> None:
    """Pack SCRIPT_OR_FOLDER into a ConfigMap and run it with torchrun on
    --nodes pods; arguments after `--` go to the script. Without --detach,
    show its progress until it ends (Ctrl-C detaches; with --rm, deletes it)."""
    if detach and remove:
        raise click.UsageError("--rm deletes the job when the command ends: not with --detach")
    try:
        selector = dict(_label(text) for text in node_selector)
        tolerations = [manifest.toleration(text) for text in toleration]
        job = connect().run(
            script_or_folder,
            nodes=nodes,
            procs_per_node=procs_per_node,
            args=args,
            image=image,
            name=name,
            entry=entry,
            gpus=gpus,
            node_selector=selector,
            tolerations=tolerations,
            runtime=runtime,
        )
    except (PackingError, InvalidSpecError, ValueError) as error:
        raise click.UsageError(str(error)) from None
    click.echo(f"trainingjob.torchfleet.dev/{job.name} created in namespace {job.namespace}")
    if detach:
        return
    try:
        follow(job, None if no_logs else rank, keep=not remove)
    finally:
        if remove:
            _delete_quietly(job)


@cli.command()
@click.argument("job")
@log_options
@kube_options
def attach(connect: Callable[[], Client], job: str, rank: int, no_logs: bool) -> None:
    """Show JOB's progress and a rank's log until it ends (Ctrl-C detaches again)."""
    follow(_job(connect(), job), None if no_logs else rank)


@cli.command(name="ls")
@click.option("-A", "--all-namespaces", is_flag=True, help="Jobs of every namespace.")
@output_option
@kube_options
def list_jobs(connect: Callable[[], Client], all_namespaces: bool, output: str | None) -> None:
    """List the TrainingJobs."""
    items = connect().list_raw(all_namespaces=all_namespaces)
    if output:
        _print_objects({"apiVersion": "v1", "kind": "List", "items": items}, output)
        return
    table = Table(box=None, header_style="bold")
    columns = ["NAME", "PHASE", "NODES", "STEP", "LOSS", "RESTARTS", "AGE"]
    if all_namespaces:
        columns.insert(0, "NAMESPACE")
    for column in columns:
        table.add_column(column)
    for item in items:
        table.add_row(*_row(item, all_namespaces))
    Console().print(table)


@cli.command()
@click.argument("job")
@kube_options
def describe(connect: Callable[[], Client], job: str) -> None:
    """Phase, conditions, progress, restarts and the last checkpoint of JOB."""
    raw = _job(connect(), job).get()
    click.echo(describe_text(raw))


@cli.command()
@click.argument("job")
@click.option(
    "--rank",
    type=click.IntRange(min=0),
    default=0,
    help="Node rank of the live pod; with --generation, the process rank.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as lines come.")
@click.option(
    "--generation",
    type=click.IntRange(min=0),
    help="A gang generation's kept log (torchfleet-train's, on the checkpoint volume), "
    "read once its pods are gone.",
)
@click.option(
    "--round",
    "round_",
    type=click.IntRange(min=0),
    default=0,
    help="In-place round (--generation).",
)
@kube_options
def logs(
    connect: Callable[[], Client],
    job: str,
    rank: int,
    follow: bool,
    generation: int | None,
    round_: int,
) -> None:
    """The trainer's log of JOB's live pod of node rank --rank; with
    --generation, a rank's log kept on the checkpoint volume (a short-lived pod
    reads it)."""
    if generation is not None:
        if follow:
            raise click.UsageError("a kept log is whole: --follow is for a live pod's")
        try:
            click.echo(connect().kept_log(job, generation, round_, rank), nl=False)
        except (JobNotFound, NoKeptLogs, KeptLogNotRead) as error:
            raise click.ClickException(str(error)) from None
        return
    try:
        found = connect().logs(job, rank=rank, follow=follow)
    except JobNotFound as error:
        raise click.ClickException(str(error)) from None
    if isinstance(found, str):
        click.echo(found, nl=False)
        return
    try:
        for line in found:
            click.echo(line)
    except KeyboardInterrupt:
        sys.exit(EXIT_DETACHED)


@cli.command()
@click.argument("job")
@kube_options
def delete(connect: Callable[[], Client], job: str) -> None:
    """Delete JOB; its pods and its code's ConfigMap go with it."""
    client = connect()
    try:
        client.delete(job)
    except JobNotFound as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"trainingjob.torchfleet.dev/{job} deleted")


# ---- following a job ----


def follow(job: Job, rank: int | None = 0, keep: bool = True) -> None:
    """A live bar from the job's status until it ends, node rank ``rank``'s log
    above it (none for None): exit 0 if it succeeded, 1 with the failure's
    reason if it failed, 130 on Ctrl-C (the job keeps running, unless not
    ``keep``: the caller deletes it)."""
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[line]}", markup=False),
        TimeElapsedColumn(),
        console=console,
    )
    ended = threading.Event()
    log: _LogPrinter | None = None
    try:
        with bar:
            log = None if rank is None else _LogPrinter(job, rank, ended)
            status = _bar_until_it_ends(job, bar)
            ended.set()
            if log is not None:  # its last lines, still above the bar
                log.close(LOG_DRAIN_SECONDS)
    except KeyboardInterrupt:
        if keep:
            again = f"torchfleet attach {job.name} -n {job.namespace}"
            console.print(f"Detached; {job.name} keeps running. Re-attach: {again}")
        sys.exit(EXIT_DETACHED)
    finally:
        if log is not None:
            log.close()
    if status.phase != PHASE_SUCCEEDED:
        raise click.ClickException(f"{job.name} failed: {progress.failure_reason(status)}")


def _delete_quietly(job: Job) -> None:
    """``run --rm``'s end: the job deleted (its pods and code go with it), said once."""
    try:
        job.delete()
    except JobNotFound:
        return
    click.echo(f"trainingjob.torchfleet.dev/{job.name} deleted", err=True)


def _bar_until_it_ends(job: Job, bar: Progress) -> TrainingJobStatus:
    """Redraws the bar from the job's status once a second, a line above it for
    each change, until the job ends; its last status."""
    task = bar.add_task(job.name, total=None, line="")
    before: TrainingJobStatus | None = None
    while True:
        try:
            status = job.status
        except JobNotFound:
            raise click.ClickException(f"{job.name} was deleted") from None
        for line in progress.changes(before, status):
            # Plain text: a reason or message may hold "[...]" (not markup)
            # and numbers (not to be coloured one by one).
            bar.console.print(line, markup=False, highlight=False)
        shown = status.progress
        bar.update(
            task,
            total=shown.total_steps if shown else None,
            completed=shown.step if shown else 0,
            line=progress.progress_line(status),
        )
        before = status
        if status.phase in progress.FINAL_PHASES:
            return status
        time.sleep(POLL_SECONDS)


class _LogPrinter:
    """Prints node rank ``rank``'s log, gang after gang, on stdout from a thread
    of its own (on a terminal, rich's live display puts the lines above the
    bar). The log is a courtesy: the status drives the bar and the exit code,
    so a log that cannot be read is said once and left.

    The thread may be waiting on the API server when the command exits; once
    ``close`` returned it writes nothing more, since a thread writing to stdout
    while the interpreter shuts down aborts it (SIGABRT)."""

    def __init__(self, job: Job, rank: int, ended: threading.Event) -> None:
        self.job, self.rank, self.ended = job, rank, ended
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._pump, name=f"log-rank-{rank}", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        try:
            for line in self.job.client.follow_logs(self.job, self.rank, ended=self.ended.is_set):
                self._echo(line)
        except Exception as error:  # any failure: the bar goes on
            self._echo(f"(node rank {self.rank}'s log is not shown: {error})", err=True)

    def _echo(self, line: str, err: bool = False) -> None:
        with self.lock:
            if not self.closed:
                click.echo(line, err=err)

    def close(self, drain: float = 0.0) -> None:
        """Waits up to ``drain`` seconds for the log's last lines, then stops printing."""
        self.thread.join(drain)
        with self.lock:
            self.closed = True


def _label(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise ValueError(f"node selector {text!r}: want KEY=VALUE")
    return key, value


# ---- printing ----


def _job(client: Client, name: str) -> Job:
    try:
        return client.get(name)
    except JobNotFound as error:
        raise click.ClickException(str(error)) from None


def _print_objects(objects: dict[str, Any], output: str) -> None:
    if output == "json":
        click.echo(json.dumps(objects, indent=2))
    else:
        click.echo(yaml.safe_dump(objects, sort_keys=False), nl=False)


def _age(created: str | None, now: datetime | None = None) -> str:
    if not created:
        return ""
    then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    return progress.duration(((now or datetime.now(UTC)) - then).total_seconds())


def _row(item: dict[str, Any], with_namespace: bool) -> list[str]:
    meta = item["metadata"]
    status = read_status(item.get("status"))
    shown = status.progress
    step = ""
    if shown is not None:
        step = f"{shown.step}/{shown.total_steps}" if shown.total_steps else str(shown.step)
    loss = f"{shown.loss:.4g}" if shown is not None and shown.loss is not None else ""
    row = [
        meta["name"],
        status.phase or "",
        status.nodes_ready or "",
        step,
        loss,
        str(status.restarts),
        _age(meta.get("creationTimestamp")),
    ]
    return [meta["namespace"], *row] if with_namespace else row


def describe_text(raw: dict[str, Any]) -> str:
    """What ``describe`` prints for one TrainingJob."""
    meta, status = raw["metadata"], read_status(raw.get("status"))
    lines = [
        f"Name:        {meta['name']}",
        f"Namespace:   {meta['namespace']}",
        f"Phase:       {status.phase or 'Pending'}",
        f"Nodes ready: {status.nodes_ready or '-'}",
        f"Progress:    {progress.progress_line(status)}",
        f"Restarts:    {status.restart_count} gang, "
        f"{status.in_place_restarts.total if status.in_place_restarts else 0} in place, "
        f"{status.disruptions} disruptions",
    ]
    checkpoint = status.last_checkpoint
    if checkpoint is not None:
        at = f" at {checkpoint.time.isoformat()}" if checkpoint.time else ""
        where = f" in {checkpoint.path}" if checkpoint.path else ""
        lines.append(f"Checkpoint:  step {checkpoint.step}{at}{where}")
    else:
        lines.append("Checkpoint:  none yet")
    if status.goodput is not None:
        lines.append(f"Goodput:     {status.goodput:.0%}")
    lines.append("Conditions:")
    for condition in status.conditions or ():
        why = progress.explained(condition)
        lines.append(f"  {condition.type}={condition.status}" + (f"  {why}" if why else ""))
    if not status.conditions:
        lines.append("  none yet")
    return "\n".join(lines)
