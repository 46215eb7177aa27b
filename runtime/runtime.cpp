#include "asgd/runtime.hpp"

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace asgd {

struct JobHandle::State {
  std::stop_source stop;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::optional<Result<JobSummary>> result;  // set once, when the job ends
};

const Result<JobSummary>& JobHandle::wait() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->result.has_value(); });
  return *state_->result;
}

bool JobHandle::wait_for(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->result.has_value(); });
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
  bool stopped = false;
  std::vector<Job> jobs;  // submitted, not yet reaped

  // Joins the threads of jobs that have ended, so a long-lived service that
  // runs many jobs does not collect threads. Caller holds mu.
  void reap() {
    std::erase_if(jobs, [](Job& job) {
      {
        std::lock_guard job_lock(job.state->mu);
        if (!job.state->result) return false;
      }
      job.thread.join();  // it has set its result: only returning is left
      return true;
    });
  }
};

Runtime::Runtime() : impl_(std::make_unique<Impl>()) {}

Runtime::~Runtime() { stop(); }

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
  if (Status s = data ? validate(config, *data) : validate(config); !s.ok()) return s;
  auto state = std::make_shared<JobHandle::State>();
  std::lock_guard lock(impl_->mu);
  if (impl_->stopped) return Status::Cancelled("the runtime has been stopped");
  impl_->reap();
  impl_->jobs.push_back({state, std::thread([state, config, data = std::move(data), callbacks = std::move(callbacks)]() mutable {
    Result<JobSummary> r = data ? run_job(config, std::move(data), callbacks, state->stop.get_token())
                                : run_job(config, callbacks, state->stop.get_token());
    {
      std::lock_guard job_lock(state->mu);
      state->result.emplace(std::move(r));
    }
    state->cv.notify_all();
  })});
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
  std::vector<Impl::Job> jobs;
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopped = true;
    for (const auto& job : impl_->jobs) job.state->stop.request_stop();
    jobs.swap(impl_->jobs);
  }
  for (Impl::Job& job : jobs) job.thread.join();
}

}  // namespace asgd
