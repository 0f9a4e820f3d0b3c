// Which ranks may share memory: a host identity that differs across machines, reboots and
// network namespaces (tests emulate hosts with `ip netns`, so ranks in different network
// namespaces must never be treated as one host).
#pragma once

#include <string>

namespace stragg {

// "<hostname>/<boot_id>/net:<netns inode>/ipc:<ipcns inode>". Ranks with equal identities can
// use the shared-memory transport.
std::string host_identity();

// For tests that play several hosts with threads of one process: while one is alive,
// host_identity() on the thread that made it returns `identity` (they nest).
class ScopedHostIdentity {
 public:
  explicit ScopedHostIdentity(std::string identity);
  ~ScopedHostIdentity();
  ScopedHostIdentity(const ScopedHostIdentity&) = delete;
  ScopedHostIdentity& operator=(const ScopedHostIdentity&) = delete;

 private:
  std::string identity_;
  const std::string* previous_;
};

// Inode of this process's pid namespace: pids of peers can only be checked for liveness when it
// matches ours.
unsigned long pid_namespace_id();

// True if `pid` (in our pid namespace) no longer runs: gone or a zombie.
bool process_is_dead(int pid);

// True if `pid` (in our pid namespace) is stopped: SIGSTOP / SIGTSTP or a debugger (state T/t).
bool process_is_stopped(int pid);

// The state letter of `pid` in /proc/<pid>/stat (R, S, D, T, t, Z, ...), 0 if unknown.
char process_state(int pid);

}  // namespace stragg
