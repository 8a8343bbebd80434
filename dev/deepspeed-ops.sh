#!/usr/bin/env bash
# DeepSpeed in the venv with its CPU shared-memory collective op compiled in,
# as the DeepSpeed trainer image installs it (trainer_image/Dockerfile.deepspeed,
# same build variables). Without it the first DeepSpeed process of every fresh
# checkout compiles the op just in time: about 2 minutes of a 2-core machine's
# `make test`, every time, because the JIT's build cache is keyed by the
# venv's paths and file times. The wheel is built once per DeepSpeed, torch
# and Python version and kept beside the cluster binaries; a fresh venv only
# reinstalls it. Without a C++ compiler it does nothing (DeepSpeed then
# compiles at first start, where the e2e test says what is missing).
#
# usage: dev/deepspeed-ops.sh PYTHON [STAMP]   (STAMP touched once the op is in)
set -euo pipefail
py=$1
stamp=${2:-}
source "$(dirname "$0")/cache-lock.sh"

op_built_in() {
  "$py" - <<'EOF'
import sys
from deepspeed.git_version_info import installed_ops
sys.exit(0 if installed_ops.get("deepspeed_shm_comm") else 1)
EOF
}

mark_done() { [ -z "$stamp" ] || touch "$stamp"; exit 0; }
op_built_in 2>/dev/null && mark_done
command -v c++ >/dev/null || { echo "[deepspeed] no C++ compiler: its op compiles at first start" >&2; exit 0; }

read -r deepspeed torch python < <("$py" - <<'EOF'
import platform
from importlib.metadata import version
print(version("deepspeed"), version("torch"), platform.python_version())
EOF
)
cache="$HOME/.cache/torchfleet/wheels/deepspeed-$deepspeed-torch$torch-py$python"
wheels() { compgen -G "$cache/deepspeed-*.whl"; }
if ! wheels >/dev/null; then
  lock_cache "$cache"
  if ! wheels >/dev/null; then
    echo "[deepspeed] building $deepspeed with its CPU op against torch $torch (once)" >&2
    tmp=$(mktemp -d "$cache.XXXXXX")
    # No pip cache: it holds the wheel built without the op, under the same key.
    if ! DS_ACCELERATOR=cpu DS_BUILD_SHM_COMM=1 "$py" -m pip wheel -q --no-deps \
      --no-build-isolation --no-cache-dir --wheel-dir "$tmp" "deepspeed==$deepspeed"; then
      # Not fatal: DeepSpeed then compiles the op at its first start, as before.
      rm -rf "$tmp"
      echo "[deepspeed] the build failed: its op compiles at first start" >&2
      exit 0
    fi
    mv "$tmp" "$cache"
  fi
fi
"$py" -m pip install -q --no-deps --force-reinstall "$(wheels | head -1)"
op_built_in && mark_done
