# Sourced by the loopback scripts in docs/: the project's venv first on PATH, a fresh scratch
# directory as the working directory ($out, removed by the caller), a free loopback port ($port).
# shellcheck shell=bash
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$root/.venv/bin:$PATH"
out=$(mktemp -d)
cd "$out" || exit 1
# shellcheck disable=SC2034 # used by the scripts that source this one
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
