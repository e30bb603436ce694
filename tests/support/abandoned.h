// A temporary directory of loom's whose maker was killed (Note [Ownership by content]): a
// child process makes it with owned::TempDir and exits without cleaning up, so the marker
// stays and its flock is gone, as after a SIGKILL.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "loom/core/owned.h"

namespace loom::testing_support {

inline std::string abandoned_temp(const std::string& parent, const std::string& base) {
  int fds[2];
  if (::pipe(fds) != 0) return "";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const auto* made = new owned::TempDir(parent, base);  // never destroyed: the maker "dies"
    const ssize_t n = ::write(fds[1], made->path().data(), made->path().size());
    ::_exit(n > 0 ? 0 : 1);
  }
  ::close(fds[1]);
  std::string path;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) path.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return path;
}

}  // namespace loom::testing_support
