#include "common/host_identity.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <utility>

namespace stragg {
namespace {

unsigned long namespace_inode(const char* which) {
  struct stat st;
  std::string path = std::string("/proc/self/ns/") + which;
  if (stat(path.c_str(), &st) != 0) return 0;
  return static_cast<unsigned long>(st.st_ino);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

thread_local const std::string* identity_override = nullptr;

}  // namespace

ScopedHostIdentity::ScopedHostIdentity(std::string identity)
    : identity_(std::move(identity)), previous_(identity_override) {
  identity_override = &identity_;
}

ScopedHostIdentity::~ScopedHostIdentity() { identity_override = previous_; }

std::string host_identity() {
  if (identity_override != nullptr) return *identity_override;
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  std::ostringstream id;
  id << name << "/" << read_first_line("/proc/sys/kernel/random/boot_id")
     << "/net:" << namespace_inode("net") << "/ipc:" << namespace_inode("ipc");
  return id.str();
}

unsigned long pid_namespace_id() { return namespace_inode("pid"); }

char process_state(int pid) {
  if (pid <= 0) return 0;
  // The state follows the command name, which may itself contain spaces and parentheses.
  std::string stat = read_first_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat.size()) return 0;
  return stat[close_paren + 2];
}

bool process_is_dead(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A killed child that its parent has not reaped yet is a zombie: still in the process table,
  // but it will never make progress again.
  const char state = process_state(pid);
  return state == 'Z' || state == 'X';
}

bool process_is_stopped(int pid) {
  const char state = process_state(pid);
  return state == 'T' || state == 't';
}

}  // namespace stragg
