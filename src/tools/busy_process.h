#pragma once
// A process that keeps one core busy: the "shared machine" case of `ellm bench`. Construct it
// before the model is loaded; it waits on a pipe until start(). Forked later, it would share
// the parent's pages copy-on-write, and the parent would pay a page copy for every page it
// wrote during the run.
#include <sys/types.h>

namespace ellm {

class BusyProcess {
 public:
  BusyProcess();
  ~BusyProcess() { stop(); }
  BusyProcess(const BusyProcess&) = delete;
  BusyProcess& operator=(const BusyProcess&) = delete;

  bool ready() const { return pid_ > 0 && start_fd_ >= 0; }
  void start();  // it spins from now on
  void stop();   // kills it

 private:
  pid_t pid_ = -1;
  int start_fd_ = -1;
};

}  // namespace ellm
