# Sourced by the test scripts: kill_tree PID stops a background job and everything it started
# (a build's compilers, a test's ranks), so that no script leaves work running when it exits.
kill_tree() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
