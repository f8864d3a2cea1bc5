#include "tools/busy_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

namespace ellm {

BusyProcess::BusyProcess() {
  int fds[2];
  if (pipe(fds) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(fds[1]);
    char go = 0;
    if (read(fds[0], &go, 1) != 1) _exit(0);  // the parent ended without a start()
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
  }
  close(fds[0]);
  start_fd_ = fds[1];
}

void BusyProcess::start() {
  char go = 1;
  if (ready() && write(start_fd_, &go, 1) != 1) stop();
}

void BusyProcess::stop() {
  if (start_fd_ >= 0) close(start_fd_);
  start_fd_ = -1;
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
}

}  // namespace ellm
