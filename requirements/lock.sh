#!/usr/bin/env bash
# Regenerates the images' pinned, hash-checked dependency locks from
# pyproject.toml (operator), requirements/trainer.in (trainer) and
# requirements/deepspeed.in (the trainer's DeepSpeed variant). Universal
# locks: one file serves every platform and Python the images may use.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-.venv/bin/uv}
export UV_CUSTOM_COMPILE_COMMAND="requirements/lock.sh"
common=(--generate-hashes --universal --python-version 3.11 --quiet)
"$uv" pip compile pyproject.toml --extra operator "${common[@]}" -o requirements/operator.txt "$@"
"$uv" pip compile requirements/trainer.in "${common[@]}" -o requirements/trainer.txt "$@"
# --no-deps: deepspeed.in names everything it needs beyond the trainer image.
"$uv" pip compile requirements/deepspeed.in --no-deps "${common[@]}" -o requirements/deepspeed.txt "$@"
