"""Replays a Dockerfile's install steps on this machine, without a Docker engine.

The point is to run the *same* steps as the image build, not a copy of them
that can drift: the Dockerfile is parsed (dockerfile-parse) and its ENV,
WORKDIR, COPY and RUN instructions are carried out in order, with every stage's
absolute paths placed under one scratch folder. A base image is stood in for
by a Python interpreter's bin folder (its ``python`` and ``pip`` come first on
PATH, as in the image).

What is deliberately not replayed: RUN steps that create users (they would
change this machine's accounts); every other RUN that is not a pip/python
command fails the replay, so nothing install-related is skipped silently.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from dockerfile_parse import DockerfileParser

REPLAYED_COMMANDS = {"pip", "python"}
USER_COMMANDS = {"groupadd", "useradd"}
# The cache only makes repeat runs fast; the hashes are checked either way.
HOST_ONLY_ENV_DROPPED = {"PIP_NO_CACHE_DIR"}
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


class ReplayError(AssertionError):
    """A step failed or the Dockerfile uses something the replay cannot honour."""


@dataclass
class Stage:
    name: str | None
    base: str
    env: dict[str, str]
    workdir: PurePosixPath = field(default_factory=lambda: PurePosixPath("/"))
    copied: list[PurePosixPath] = field(default_factory=list)  # absolute destinations
    skipped: list[str] = field(default_factory=list)
    user: str | None = None
    entrypoint: list[str] = field(default_factory=list)


@dataclass
class Replay:
    """The final stage's state after the replay."""

    root: Path
    stage: Stage

    def host_path(self, path: str | PurePosixPath) -> Path:
        return self.root / PurePosixPath(path).relative_to("/")

    def entrypoint_executable(self) -> Path:
        """Resolves ENTRYPOINT's program on the final stage's PATH. When it
        resolves inside the scratch root it must lie in something this stage
        copied in: a leftover of an earlier stage would not be in the image."""
        program = self.stage.entrypoint[0]
        found = shutil.which(program, path=self.stage.env["PATH"])
        if not found:
            raise ReplayError(f"ENTRYPOINT {program!r} is not on the final PATH")
        resolved = Path(found)
        if resolved.is_relative_to(self.root):
            image_path = PurePosixPath("/") / resolved.relative_to(self.root)
            if not any(image_path.is_relative_to(c) for c in self.stage.copied):
                raise ReplayError(f"{image_path} comes from an earlier stage, not the final one")
        return resolved


def replay(
    dockerfile: Path,
    context: Path,
    root: Path,
    bases: Mapping[str, Path],
    host_env: Mapping[str, str],
) -> Replay:
    """Runs every stage of ``dockerfile``. ``bases`` maps each base image to the
    bin folder standing in for it; ``host_env`` seeds each stage's environment
    (HOME for pip's cache, for instance)."""
    parser = DockerfileParser(fileobj=dockerfile.open("rb"))
    ignore = dockerignore_rules(context)
    args = _arg_defaults(parser.structure)
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for instruction in parser.structure:
        kind, value = instruction["instruction"], instruction["value"]
        if kind in {"COMMENT", "ARG", "LABEL", "EXPOSE"}:
            continue
        if kind == "FROM":
            stage = _from(value, args, bases, host_env)
            if stage.name:
                stages[stage.name] = stage
            continue
        if stage is None:
            raise ReplayError(f"{kind} before FROM")
        if kind == "ENV":
            _env(stage, value, root)
        elif kind == "WORKDIR":
            stage.workdir = stage.workdir / _expand(value, stage.env)
            _host(root, stage.workdir).mkdir(parents=True, exist_ok=True)
        elif kind == "COPY":
            _copy(stage, value, context, root, ignore)
        elif kind == "RUN":
            _run(stage, value, root)
        elif kind == "USER":
            stage.user = value
        elif kind == "ENTRYPOINT":
            stage.entrypoint = json.loads(value)
        else:
            raise ReplayError(f"the replay does not know {kind} ({value})")
    if stage is None:
        raise ReplayError(f"{dockerfile} has no FROM")
    return Replay(root=root, stage=stage)


def base_images(dockerfile: Path) -> list[str]:
    """The images the stages start FROM, with ARG defaults filled in."""
    parser = DockerfileParser(fileobj=dockerfile.open("rb"))
    args = _arg_defaults(parser.structure)
    return [
        _expand(i["value"].split()[0], args) for i in parser.structure if i["instruction"] == "FROM"
    ]


def _arg_defaults(structure: list[dict[str, str]]) -> dict[str, str]:
    args = {}
    for instruction in structure:
        if instruction["instruction"] == "ARG" and "=" in instruction["value"]:
            key, default = instruction["value"].split("=", 1)
            args[key.strip()] = default.strip()
    return args


def _from(
    value: str, args: Mapping[str, str], bases: Mapping[str, Path], host_env: Mapping[str, str]
) -> Stage:
    words = value.split()
    base = _expand(words[0], args)
    name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
    if base not in bases:
        raise ReplayError(f"no stand-in for base image {base!r}; have {sorted(bases)}")
    env = dict(host_env)
    env["PATH"] = f"{bases[base]}:/usr/bin:/bin"
    return Stage(name=name, base=base, env=env)


def _env(stage: Stage, value: str, root: Path) -> None:
    for pair in shlex.split(value):
        key, raw = pair.split("=", 1)
        if key in HOST_ONLY_ENV_DROPPED:
            continue
        # Absolute image paths move under the scratch root before expansion,
        # so "$VIRTUAL_ENV/bin:$PATH" keeps the host PATH the base provides.
        mapped = ":".join(
            str(_host(root, PurePosixPath(part))) if part.startswith("/") else part
            for part in raw.split(":")
        )
        stage.env[key] = _expand(mapped, stage.env)


def _copy(
    stage: Stage, value: str, context: Path, root: Path, ignore: list[tuple[bool, str]]
) -> None:
    words = shlex.split(value)
    source_stage = None
    if words[0].startswith("--from="):
        source_stage = words.pop(0).removeprefix("--from=")
    *sources, destination = words
    dest = stage.workdir / destination  # an absolute destination replaces the workdir
    into_folder = destination.endswith("/") or len(sources) > 1
    for source in sources:
        if source_stage is None:
            if is_ignored(source, ignore):
                raise ReplayError(f"COPY {source}: excluded by .dockerignore")
            src = context / source
        else:
            src = _host(root, PurePosixPath(source))
        target = dest / PurePosixPath(source).name if into_folder and src.is_file() else dest
        host_target = _host(root, target)
        if src == host_target:
            stage.copied.append(target)  # same path in both stages: Docker copies onto itself
            continue
        if src.is_dir():
            shutil.copytree(src, host_target, dirs_exist_ok=True, ignore=_pycache)
        elif src.is_file():
            host_target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, host_target)
        else:
            raise ReplayError(f"COPY {source}: no such file")
        stage.copied.append(target)


def _run(stage: Stage, command: str, root: Path) -> None:
    program = shlex.split(command)[0]
    if program in USER_COMMANDS:
        stage.skipped.append(command)
        return
    if program not in REPLAYED_COMMANDS:
        raise ReplayError(f"RUN {command!r}: only pip/python steps are replayed")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=_host(root, stage.workdir),
        env=stage.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise ReplayError(
            f"RUN {command} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def _host(root: Path, path: PurePosixPath) -> Path:
    return root / path.relative_to("/")


def _expand(text: str, env: Mapping[str, str]) -> str:
    return VARIABLE.sub(lambda m: env.get(m[1] or m[2], ""), text)


def _pycache(_folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))]


def dockerignore_rules(context: Path) -> list[tuple[bool, str]]:
    """(negated, pattern) rules, in order; the last that matches decides."""
    path = context / ".dockerignore"
    if not path.exists():
        return []
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            rules.append((negated, line.removeprefix("!").strip("/")))
    return rules


def is_ignored(source: str, rules: list[tuple[bool, str]]) -> bool:
    """Docker's rule: a path is excluded when the last pattern matching it (or
    one of its parent folders) is not a negation."""
    path = PurePosixPath(source.strip("/"))
    candidates = [path, *path.parents][:-1]  # the path and its parents, not "."
    excluded = False
    for negated, pattern in rules:
        if any(fnmatch(str(c), pattern) for c in candidates):
            excluded = not negated
    return excluded


def host_environment() -> dict[str, str]:
    """What each stage inherits from this machine: HOME (pip's cache) and a locale."""
    return {"HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
