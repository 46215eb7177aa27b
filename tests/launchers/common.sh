# Sourced by the launcher tests.

# free_port [ADDRESS]: a TCP port the kernel has just found free on ADDRESS
# (default 127.0.0.1); a random one may be taken (it was, once, in CI).
free_port() {
  python3 -c "import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])" \
    "${1:-127.0.0.1}"
}
