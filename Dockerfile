# syntax=docker/dockerfile:1
# The torchfleet operator image: kopf, the Kubernetes client and the operator
# in a virtual environment on a slim Python, running as a non-root user. It
# never contains torch: the operator only builds pods, it does not train.
#
#   docker build -t ghcr.io/torchfleet/operator:0.1.0 .
#
# tests/images/ lints this file with hadolint and checks that
# `torchfleet-operator --help` works in the image built from it without Docker
# (dev/realnode/operator-image.sh: buildah over a Debian stand-in for the base),
# or, where that builder cannot run, after a replay of its install steps in a
# clean virtual environment.

# Release builds pin the base by digest: --build-arg PYTHON_IMAGE=python@sha256:...
ARG PYTHON_IMAGE=python:3.11-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/torchfleet
RUN python -m venv "$VIRTUAL_ENV"
ENV PATH="$VIRTUAL_ENV/bin:$PATH"
WORKDIR /src
# Every dependency pinned with its hashes (requirements/lock.sh), in a layer
# of its own that source edits do not invalidate.
COPY requirements/operator.txt requirements/
RUN pip install --require-hashes --no-deps -r requirements/operator.txt
COPY pyproject.toml README.md ./
COPY contract/torchfleet_contract/ contract/torchfleet_contract/
COPY operator/torchfleet_operator/ operator/torchfleet_operator/
# --no-index: the operator extra must be satisfied by the lock alone, so a
# dependency missing from the lock fails here instead of floating in.
RUN pip wheel --no-deps --wheel-dir dist . \
 && pip install --no-index "$(echo dist/torchfleet-*.whl)[operator]" \
 && pip check

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="torchfleet-operator" \
      org.opencontainers.image.description="Kubernetes operator for distributed PyTorch TrainingJobs" \
      org.opencontainers.image.source="https://github.com/torchfleet/torchfleet" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric user, so the chart's runAsNonRoot/runAsUser can verify it.
RUN groupadd --system --gid 65532 torchfleet \
 && useradd --system --uid 65532 --gid torchfleet --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin torchfleet
COPY --from=build /opt/torchfleet /opt/torchfleet
ENV PATH="/opt/torchfleet/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
# kopf's /healthz and the operator's /metrics (the chart's defaults).
EXPOSE 8080 9090
ENTRYPOINT ["torchfleet-operator"]
