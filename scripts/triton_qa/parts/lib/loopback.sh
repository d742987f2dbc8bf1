# Sourced by the part scripts that start a service of their own on loopback (L0_storage_azure,
# parts/lib/s3_server.sh): a free port for it, and a wait until it accepts connections.
free_port() {
  "$NURSERY_QA_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_port() {  # up to 20 s
  for _ in $(seq 100); do
    "$NURSERY_QA_PYTHON" -c "import socket; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}
