# Sourced by the build scripts: one builder at a time per cache folder.
# `make demo` and `make test` (or a test fixture) started together on a cold
# machine would otherwise compile the same binary twice and race on its
# temporary file (one `mv` finds the other's already moved). The lock is taken
# only on the cold path; a warm run never waits.
#
# usage: lock_cache DIR   (holds the lock until the script exits)
lock_cache() {
  mkdir -p "$(dirname "$1")"
  exec {cache_lock_fd}>"$1.lock"
  if ! flock -n "$cache_lock_fd"; then
    echo "[build] waiting for another build of $(basename "$1")" >&2
    flock "$cache_lock_fd"
  fi
}
