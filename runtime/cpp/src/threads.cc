#include "threads.h"

#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <string>

// Exported by libtvm_runtime (TVM_DLL, include/tvm/runtime/threading_backend.h; the wheel ships
// no TVM headers): replaces the calling thread's pool with a new one.
namespace tvm::runtime::threading {
void ResetThreadPool();
}  // namespace tvm::runtime::threading

namespace aotc {
namespace {

thread_local bool t_ran = false;  // this thread's TVM pool has started

// Right after a fork, in the forking thread of the child, before it makes any thread: the
// parent's workers' joins return at once and TVM starts new ones.
void AfterForkInChild() {
  if (t_ran) tvm::runtime::threading::ResetThreadPool();
}

const int kAtForkRegistered = pthread_atfork(nullptr, nullptr, &AfterForkInChild);

int AllowedCores(cpu_set_t* set) {
  CPU_ZERO(set);
  if (sched_getaffinity(0, sizeof(cpu_set_t), set) != 0) return 0;
  return CPU_COUNT(set);
}

bool Enabled(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  return value ? std::strcmp(value, "0") != 0 : fallback;
}

}  // namespace

void RunWithLivePool(const std::function<void()>& work) {
  (void)kAtForkRegistered;
  t_ran = true;
  work();
}

void SetDefaultThreadCount() {
  if (std::getenv("TVM_NUM_THREADS")) return;
  const char* chosen = std::getenv("AOTC_NUM_THREADS");
  cpu_set_t set;
  std::string count = chosen ? chosen : std::to_string(AllowedCores(&set) > 0 ? CPU_COUNT(&set) : 1);
  setenv("TVM_NUM_THREADS", count.c_str(), 0);
}

CallerOnFirstCore::CallerOnFirstCore() {
  static_assert(sizeof(saved_) >= sizeof(cpu_set_t), "cpu_set_t does not fit");
  cpu_set_t allowed;
  const char* threads = std::getenv("TVM_NUM_THREADS");
  int cores = AllowedCores(&allowed);
  // Only when the pool's pinned workers cover every other allowed core.
  if (cores < 2 || !threads || std::atoi(threads) != cores || !Enabled("TVM_BIND_THREADS", true)) {
    return;
  }
  cpu_set_t first;
  CPU_ZERO(&first);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      CPU_SET(cpu, &first);
      break;
    }
  }
  std::memcpy(saved_, &allowed, sizeof(cpu_set_t));
  pinned_ = pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &first) == 0;
}

CallerOnFirstCore::~CallerOnFirstCore() {
  if (pinned_) {
    pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t),
                           reinterpret_cast<cpu_set_t*>(saved_));
  }
}

}  // namespace aotc
