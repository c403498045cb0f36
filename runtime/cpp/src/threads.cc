#include "threads.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace aotc {
namespace {

std::atomic<unsigned> g_generation{0};  // counts forks: a kernel thread of an older one is gone

void AfterForkInChild() { g_generation.fetch_add(1); }

const int kAtForkRegistered = pthread_atfork(nullptr, nullptr, &AfterForkInChild);

class KernelThread {
 public:
  KernelThread() : generation(g_generation.load()), thread_([this] { Serve(); }) {}

  ~KernelThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  void Run(const std::function<void()>& work) {
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &work;
    done_ = false;
    error_ = nullptr;
    lock.unlock();
    wake_.notify_one();  // unlocked: the woken thread does not block on the mutex at once
    lock.lock();
    finished_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

  const unsigned generation;

 private:
  void Serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      const std::function<void()>* job = job_;
      job_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        (*job)();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      lock.unlock();
      finished_.notify_one();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  const std::function<void()>* job_ = nullptr;
  bool done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members it uses exist
};

// The calling thread's kernel thread. One made before a fork is left alone in the child: its
// thread does not exist there, and destroying its condition variables would wait for it.
struct CallerKernels {
  KernelThread* kernels = nullptr;
  ~CallerKernels() {
    if (kernels && kernels->generation == g_generation.load()) delete kernels;
  }
};

thread_local CallerKernels t_caller;

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

void RunPooled(const std::function<void()>& work) {
  (void)kAtForkRegistered;
  const char* threads = std::getenv("TVM_NUM_THREADS");
  if (threads && std::atoi(threads) == 1) return work();
  KernelThread*& kernels = t_caller.kernels;
  if (!kernels || kernels->generation != g_generation.load()) kernels = new KernelThread();
  kernels->Run(work);
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
