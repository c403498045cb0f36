// Thread settings the Python runtime applies too (aotc/settings.py, runtime/thread_placement.py),
// so that the C++ runner measures what Python users get.
#ifndef AOTC_THREADS_H_
#define AOTC_THREADS_H_

#include <functional>

namespace aotc {

// Runs `work` (which runs TVM kernels), noting that this thread's TVM pool has started. TVM
// keeps a pool per calling thread; in a forked child the forking thread's pool pointed at
// workers that do not exist there, and its next parallel kernel waited forever. A
// pthread_atfork handler resets that pool in the child when the thread had run a model.
// (Python's runtime does the same: runtime/forks.py.)
void RunWithLivePool(const std::function<void()>& work);

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
