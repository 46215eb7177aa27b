#include "asgd/runtime.hpp"

#include <malloc.h>

#include <algorithm>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>
#include <system_error>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

namespace asgd {

namespace {

// The job (its JobHandle::State) whose callback this thread is running, if
// any: Runtime::start marks every callback. That job waits for its
// callback, so waiting for the job from there would never end.
thread_local const void* t_in_callback_of = nullptr;

template <class... Args>
std::function<void(Args...)> marked(const void* job, std::function<void(Args...)> callback) {
  if (!callback) return callback;
  return [job, callback = std::move(callback)](Args... args) {
    struct Mark {
      const void* outer;
      ~Mark() { t_in_callback_of = outer; }
    } mark{std::exchange(t_in_callback_of, job)};
    callback(std::forward<Args>(args)...);
  };
}

}  // namespace

struct JobHandle::State {
  std::stop_source stop;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::optional<Result<JobSummary>> result;  // set once, when the job ends
  const void* runtime = nullptr;             // the Runtime (its Impl) that runs the job
};

Result<JobSummary> JobHandle::wait() const {
  if (t_in_callback_of == state_.get())
    return Status::InvalidArgument(
        "JobHandle::wait() from the job's own callback would never return (the job waits for its callback)");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->result.has_value(); });
  return *state_->result;
}

bool JobHandle::wait_for(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mu);
  if (t_in_callback_of == state_.get()) return state_->result.has_value();  // it cannot end meanwhile
  // A deadline past the steady clock's range (milliseconds::max(), "for
  // ever") overflowed inside wait_for, which then returned false at once.
  const auto now = std::chrono::steady_clock::now();
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::time_point::max() - now);
  if (timeout >= room) {
    state_->cv.wait(lock, [&] { return state_->result.has_value(); });
    return true;
  }
  return state_->cv.wait_until(lock, now + timeout, [&] { return state_->result.has_value(); });
}

bool JobHandle::done() const {
  std::lock_guard lock(state_->mu);
  return state_->result.has_value();
}

void JobHandle::cancel() const { state_->stop.request_stop(); }

struct Runtime::Impl {
  struct Job {
    std::shared_ptr<JobHandle::State> state;
    std::thread thread;
  };
  mutable std::mutex mu;
  // Held by stop() until every job has ended: a second caller waits for
  // them too instead of returning while the first is still joining.
  std::mutex stopping;
  bool stopped = false;
  std::vector<Job> jobs;  // submitted, not yet reaped
  // Jobs whose callback is inside stop(): another such stop() leaves their
  // threads alone (each joining the other's would never end).
  std::vector<const void*> stopping_from_callback;

  // Joins the threads of jobs that have ended, so a long-lived service that
  // runs many jobs does not collect threads. Caller holds mu.
  void reap() {
    std::erase_if(jobs, [](Job& job) {
      {
        std::lock_guard job_lock(job.state->mu);
        if (!job.state->result || !job.thread.joinable()) return false;
      }
      job.thread.join();  // it has set its result: only returning is left
      return true;
    });
  }

  // Every Runtime alive, for exit(): a job still running when the program
  // exits would compute while the libraries' statics are torn down
  // (OpenBLAS frees its buffers under a worker's sgemm: a SIGSEGV). An
  // atexit handler, registered at the first submit, after those libraries
  // and asgd's registries started, stops every job first (statics a job
  // first builds on its own threads may still be torn down before it).
  // Never destroyed, like the log.
  struct Live {
    std::mutex mu;
    std::vector<Impl*> all;
    // Jobs of Runtimes destroyed from a callback, left to end on their own
    // threads (detached): exit() waits for them too.
    std::vector<std::shared_ptr<JobHandle::State>> orphans;
    bool exiting = false;  // exit() has begun: a Runtime made now starts stopped
  };
  static Live& live() {
    static Live* const live = new Live;
    return *live;
  }

  // Cancels every job and waits until each has ended (its result set; its
  // thread may still be returning), except the one whose callback called
  // exit(), which waits for that call. Not stop(): a callback may make or
  // destroy a Runtime meanwhile, which takes the list's lock, so the wait
  // is outside it (stop() under it never ended); and ~Runtime in a
  // callback frees what a stop() of this thread would be using.
  static void stop_every_job_at_exit() {
    std::vector<std::shared_ptr<JobHandle::State>> running;
    {
      std::lock_guard lock(live().mu);
      live().exiting = true;
      for (const auto& state : live().orphans) {
        state->stop.request_stop();
        if (state.get() != t_in_callback_of) running.push_back(state);
      }
      for (Impl* impl : live().all) {
        std::lock_guard impl_lock(impl->mu);
        impl->stopped = true;
        for (const Job& job : impl->jobs) {
          job.state->stop.request_stop();
          if (job.state.get() != t_in_callback_of) running.push_back(job.state);
        }
      }
    }
    for (const auto& state : running) {
      std::unique_lock lock(state->mu);
      state->cv.wait(lock, [&] { return state->result.has_value(); });
    }
  }
};

namespace {

// glibc raises its trim threshold as a program frees large blocks (up to
// 64 MiB) and never gives back the free top of a thread's arena below it:
// each job's new threads left tens of MB in arenas nothing used again (RSS
// grew about 25 MB a job, 831 MB after 24). Fixed thresholds give it back;
// large buffers (up to 32 MiB) still come from the arenas, so training
// loses no speed (measured: asgd train, 110k samples/s either way). The
// allocator is the process's: a host that chose its own settings (the
// MALLOC_* variables or GLIBC_TUNABLES) keeps them.
void give_freed_memory_back() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* chosen : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"})
      if (std::getenv(chosen)) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 20);
  });
}

}  // namespace

Runtime::Runtime() : impl_(std::make_shared<Impl>()) {
  give_freed_memory_back();
  auto& live = Impl::live();
  std::lock_guard lock(live.mu);
  live.all.push_back(impl_.get());
  impl_->stopped = live.exiting;  // made by a callback while the program exits
}

Runtime::~Runtime() {
  {
    auto& live = Impl::live();
    std::lock_guard lock(live.mu);
    std::erase(live.all, impl_.get());
  }
  stop();
  // Destroyed from a callback of its own job: that job ends once the
  // callback returns, and any whose callback is inside stop() too, on
  // threads left to themselves (such a stop() keeps the Impl alive until
  // it returns); exit() still waits for them.
  auto& live = Impl::live();
  std::lock_guard live_lock(live.mu);  // (before the Impl's, as exit()'s handler takes them)
  std::lock_guard lock(impl_->mu);
  std::erase_if(live.orphans, [](const auto& state) {
    std::lock_guard state_lock(state->mu);
    return state->result.has_value();
  });
  for (Impl::Job& job : impl_->jobs) {
    if (!job.thread.joinable()) continue;
    job.thread.detach();
    live.orphans.push_back(job.state);
  }
}

Result<JobHandle> Runtime::submit(const JobConfig& config, JobCallbacks callbacks) {
  return start(config, nullptr, std::move(callbacks));
}

Result<JobHandle> Runtime::submit(const JobConfig& config, std::shared_ptr<const UserDataset> data,
                                  JobCallbacks callbacks) {
  // A null dataset is a caller's mistake, not a request for config.dataset.
  if (!data) return Status::InvalidArgument("Runtime::submit: no user data (a null UserDataset)");
  return start(config, std::move(data), std::move(callbacks));
}

// Validates, then runs the job on a thread of its own (on `data` when set).
Result<JobHandle> Runtime::start(const JobConfig& config, std::shared_ptr<const UserDataset> data,
                                 JobCallbacks callbacks) {
  {
    std::lock_guard lock(impl_->mu);  // (before validate: it reads statics exit() may have torn down)
    if (impl_->stopped) return Status::Cancelled("the runtime has been stopped");
  }
  if (Status s = data ? validate(config, *data) : validate(config); !s.ok()) return s;
  // Registered once the statics validate reads (the registries) exist:
  // exit() runs it before it destroys them.
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(&Impl::stop_every_job_at_exit); });
  // The caller may change or free its data once this returns (the job
  // reads it later, on its thread): the job gets a copy of its own.
  if (data) data = std::make_shared<const UserDataset>(*data);
  auto state = std::make_shared<JobHandle::State>();
  state->runtime = impl_.get();
  callbacks = {marked(state.get(), std::move(callbacks.on_epoch)), marked(state.get(), std::move(callbacks.on_eval)),
               marked(state.get(), std::move(callbacks.on_progress)),
               marked(state.get(), std::move(callbacks.on_final_params))};
  std::lock_guard lock(impl_->mu);
  if (impl_->stopped) return Status::Cancelled("the runtime has been stopped");
  impl_->reap();
  // Nothing is thrown at the host: a thread that cannot start (a limit on
  // threads or address space) is the job's unavailable.
  try {
    impl_->jobs.reserve(impl_->jobs.size() + 1);
    impl_->jobs.push_back({state, std::thread([state, config, data = std::move(data), callbacks = std::move(callbacks)]() mutable {
      Result<JobSummary> r = data ? run_job(config, std::move(data), callbacks, state->stop.get_token())
                                  : run_job(config, callbacks, state->stop.get_token());
      // What the callbacks hold goes now, on this job's behalf: a host's
      // shared_ptr to this Runtime in one may be its last (its destructor,
      // here, then leaves this thread to end alone instead of joining it).
      {
        const void* outer = std::exchange(t_in_callback_of, state.get());
        callbacks = {};
        data.reset();
        t_in_callback_of = outer;
      }
      {
        std::lock_guard job_lock(state->mu);
        state->result.emplace(std::move(r));
      }
      state->cv.notify_all();
    })});
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("starting the job failed: a thread could not start (") + e.what() +
                               "); raise the process's limits on threads and address space");
  } catch (const std::bad_alloc&) {
    return Status::Unavailable("starting the job failed: out of memory");
  }
  return JobHandle(state);
}

Result<JobSummary> Runtime::run(const JobConfig& config, JobCallbacks callbacks) {
  auto handle = submit(config, std::move(callbacks));
  if (!handle) return handle.status();
  return handle->wait();
}

std::size_t Runtime::running() const {
  std::lock_guard lock(impl_->mu);
  std::size_t n = 0;
  for (const auto& job : impl_->jobs) {
    std::lock_guard job_lock(job.state->mu);
    n += !job.state->result.has_value();
  }
  return n;
}

void Runtime::stop() {
  // From a callback of one of this Runtime's jobs: that job waits for the
  // callback, so it is cancelled and left to end on its own once the
  // callback returns (it stays among the jobs: a later stop() waits for
  // it, running() counts it); and a stop() under way elsewhere, which may
  // be waiting for that very job, is not waited for, nor are jobs whose
  // callbacks are inside stop() too (each would wait for the other). From
  // another Runtime's job's callback, a stop waits as any other does.
  // The Impl is held here: a callback may destroy the Runtime meanwhile.
  const std::shared_ptr<Impl> impl = impl_;
  const bool in_callback =
      t_in_callback_of != nullptr && static_cast<const JobHandle::State*>(t_in_callback_of)->runtime == impl.get();
  const void* own = in_callback ? t_in_callback_of : nullptr;
  std::unique_lock stopping(impl->stopping, std::defer_lock);
  if (!in_callback) stopping.lock();
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<JobHandle::State>> ending;
  {
    std::lock_guard lock(impl->mu);
    impl->stopped = true;
    auto& from_callback = impl->stopping_from_callback;
    if (own) from_callback.push_back(own);
    for (Impl::Job& job : impl->jobs) {
      job.state->stop.request_stop();
      if (job.state.get() == own) continue;
      if (own && std::find(from_callback.begin(), from_callback.end(), job.state.get()) != from_callback.end())
        continue;
      ending.push_back(job.state);
      if (job.thread.joinable()) threads.push_back(std::move(job.thread));
    }
  }
  for (std::thread& thread : threads) thread.join();
  // Those another stop() took to join: ended, if not yet joined.
  for (const auto& state : ending) {
    std::unique_lock lock(state->mu);
    state->cv.wait(lock, [&] { return state->result.has_value(); });
  }
  std::lock_guard lock(impl->mu);
  if (own) std::erase(impl->stopping_from_callback, own);
  std::erase_if(impl->jobs, [](const Impl::Job& job) {
    std::lock_guard job_lock(job.state->mu);
    return !job.thread.joinable() && job.state->result.has_value();
  });
}

}  // namespace asgd
