// Thread settings the Python runtime applies too (aotc/settings.py, runtime/thread_placement.py),
// so that the C++ runner measures what Python users get.
#ifndef AOTC_THREADS_H_
#define AOTC_THREADS_H_

#include <functional>

namespace aotc {

// Runs `work` (which runs TVM kernels) on this thread's kernel thread, so that no caller's thread
// ever starts a TVM pool. TVM keeps a pool per calling thread; in a forked child the forking
// thread's pool has no workers, and its condition variables still count the parent's sleeping
// workers as waiters: destroying them (TVM's ResetThreadPool, or the thread-local destructors
// exit() runs) waited forever. A kernel thread is started per calling thread and joined when
// that thread ends; a fork copies none, so a child starts new ones. With one TVM thread no pool
// starts and `work` runs here. (Python's runtime does the same: runtime/forks.py.)
void RunPooled(const std::function<void()>& work);

// TVM's pool takes half the cores on x86 (it assumes hyper-threads) unless TVM_NUM_THREADS is
// set when it starts: set it, before the first run, to AOTC_NUM_THREADS or every allowed core.
void SetDefaultThreadCount();

// TVM pins its workers to the last cores and leaves the calling thread (worker 0) free to
// migrate onto one of them (measured 2x slower in 2 of 8 processes here). While alive, this
// keeps the calling thread on the first allowed core, which the pinned workers leave free.
class CallerOnFirstCore {
 public:
  CallerOnFirstCore();
  ~CallerOnFirstCore();

 private:
  bool pinned_ = false;
  unsigned char saved_[128];  // the caller's cpu_set_t
};

}  // namespace aotc

#endif  // AOTC_THREADS_H_
