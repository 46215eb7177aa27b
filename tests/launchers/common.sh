# Sourced by the launcher tests.

# free_port [ADDRESS]: a TCP port the kernel has just found free on ADDRESS
# (default 127.0.0.1); a random one may be taken (it was, once, in CI).
free_port() {
  python3 -c "import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])" \
    "${1:-127.0.0.1}"
}

# mpirun_prelude MNIST_DIR: for the tests that run a real mpirun. Exits 77
# (skipped) without the data or mpirun; makes $scratch, removed at exit;
# sets the array root to the flags mpirun needs as root.
mpirun_prelude() {
  [[ -d "$1" ]] && command -v mpirun >/dev/null || exit 77
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  root=()
  [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
}
