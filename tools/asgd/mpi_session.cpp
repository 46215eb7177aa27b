// --collective mpi (tools/asgd/mpi_session.hpp): the workers' all-reduce
// through Open MPI's MPI_Allreduce.
//
// A worker's collective has a thread of its own, the only one that calls
// MPI after initialization (MPI_THREAD_SERIALIZED). Each round it sums, over
// the workers' communicator, its gradient times its samples with two values
// appended: the samples and 1 (still training). A worker that runs out of
// data keeps joining the others' rounds with nothing (zeros) until a round
// in which nobody is still training, so that every worker calls
// MPI_Allreduce as often as every other: MPI cannot drop a rank. For the same
// reason a worker declared lost stops the job: the others would wait for it
// inside MPI_Allreduce for good, so the collective logs which worker it was
// and calls MPI_Abort, and mpirun ends every rank.
#include "tools/asgd/mpi_session.hpp"

#include <mpi.h>
#include <spdlog/fmt/fmt.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "base/log.hpp"

namespace asgd::cli {

namespace {

using messaging::PeerCopy;
using messaging::Rank;
using messaging::Round;

class MpiCollective final : public messaging::NetworkCollective {
 public:
  MpiCollective(MPI_Comm comm, int rank, int size)
      : comm_(comm), rank_(static_cast<Rank>(rank)), size_(static_cast<Rank>(size)),
        endpoint_(fmt::format("mpi:{}", rank)) {
    thread_ = std::thread([this] { run(); });
  }

  ~MpiCollective() override {
    leave(rank_);  // the others may still be training: keep step with them until they are done
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  const std::string& endpoint() const override { return endpoint_; }
  Status connect(Rank rank, const std::vector<std::string>& endpoints) override {
    if (rank != rank_ || endpoints.size() != size_)
      return Status::InvalidArgument(fmt::format(
          "--collective mpi: this process is worker {} of {} under mpirun, but the job made it worker {} of {}",
          rank_, size_, rank, endpoints.size()));
    return {};
  }
  std::uint64_t rejected() const override { return 0; }
  void set_half_precision(bool) override {}  // MPI's sums stay float32
  void set_shared_memory(bool, std::chrono::milliseconds) override {}  // Open MPI picks its own transports
  Rank size() const override { return size_; }

  Status allreduce_mean(Rank rank, Round round, std::span<const float> data, double weight, Ready ready) override {
    std::lock_guard lock(mu_);
    if (rank != rank_) return Status::InvalidArgument(fmt::format("rank {} called the collective of rank {}", rank, rank_));
    if (left_) return Status::InvalidArgument(fmt::format("rank {} called the collective after it left", rank));
    if (pending_ || in_flight_)
      return Status::InvalidArgument(fmt::format("rank {} called the collective with a call in flight", rank));
    if (length_ != 0 && data.size() != length_)
      return Status::InvalidArgument(fmt::format("rank {}: an all-reduce of {} values, not {}", rank, data.size(), length_));
    length_ = data.size();
    call_ = {round, data, weight, std::move(ready)};
    pending_ = true;
    cv_.notify_all();
    return {};
  }
  std::span<const float> mean(Rank) const override {
    std::lock_guard lock(mu_);
    return total_ > 0 ? std::span<const float>(mean_) : std::span<const float>();
  }
  double total_weight(Rank) const override {
    std::lock_guard lock(mu_);
    return total_;
  }

  Status gossip(Rank, Round, std::span<const float>, const std::vector<Rank>&, const std::vector<Rank>&, Round,
                Ready) override {
    return Status::InvalidArgument("--collective mpi runs the allreduce policy only, not gossip");
  }
  std::vector<PeerCopy> peer_copies(Rank) const override { return {}; }

  void leave(Rank rank) override {
    if (rank != rank_) {
      logger().error("worker {}: worker {} was lost, and under --collective mpi the others cannot go on without it "
                     "(MPI_Allreduce waits for every rank): stopping the job",
                     rank_, rank);
      MPI_Abort(MPI_COMM_WORLD, 1);
      return;
    }
    std::lock_guard lock(mu_);
    left_ = true;
    cv_.notify_all();
  }

  std::string waiting_for(Rank) const override {
    std::lock_guard lock(mu_);
    if (!pending_ && !in_flight_) return {};
    return fmt::format("the all-reduce of step {} in MPI_Allreduce (it waits for every worker under mpirun)",
                       call_.round);
  }

 private:
  struct Call {
    Round round = 0;
    std::span<const float> data;
    double weight = 0;
    Ready ready;
  };

  // Its rounds, then (once left) rounds of nothing until nobody trains.
  void run() {
    for (;;) {
      Call call;
      bool real = false;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return pending_ || left_ || stop_; });
        if (pending_) {
          call = std::move(call_);
          call_.ready = nullptr;
          pending_ = false;
          in_flight_ = real = true;
        } else if (length_ == 0 || everyone_done_) {
          if (stop_) return;  // never took a step, or all are done: nothing to keep step with
          cv_.wait(lock, [&] { return stop_; });
          return;
        }
      }
      const std::size_t n = length_;
      buf_.assign(n + 2, 0.0f);
      if (real && call.weight > 0) {
        const auto w = static_cast<float>(call.weight);
        for (std::size_t i = 0; i < n; ++i) buf_[i] = w * call.data[i];
        buf_[n] = w;
      }
      buf_[n + 1] = real ? 1.0f : 0.0f;
      MPI_Allreduce(MPI_IN_PLACE, buf_.data(), static_cast<int>(n + 2), MPI_FLOAT, MPI_SUM, comm_);
      std::unique_lock lock(mu_);
      if (!real) {
        everyone_done_ = buf_[n + 1] == 0.0f;
        continue;
      }
      total_ = buf_[n];
      mean_.assign(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(n));
      if (total_ > 0) {
        const auto inv = static_cast<float>(1.0 / total_);
        for (float& v : mean_) v *= inv;
      }
      in_flight_ = false;
      lock.unlock();
      call.ready();
    }
  }

  MPI_Comm comm_;
  const Rank rank_, size_;
  const std::string endpoint_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Call call_;
  bool pending_ = false, in_flight_ = false, left_ = false, stop_ = false, everyone_done_ = false;
  std::size_t length_ = 0;
  std::vector<float> buf_;  // the thread's
  std::vector<float> mean_;
  double total_ = 0;
};

class OpenMpiSession final : public MpiSession {
 public:
  OpenMpiSession(MPI_Comm workers, std::shared_ptr<messaging::NetworkCollective> collective)
      : workers_(workers), collective_(std::move(collective)) {}
  ~OpenMpiSession() override {
    collective_.reset();  // its thread keeps step with the other workers until they are done
    if (workers_ != MPI_COMM_NULL) MPI_Comm_free(&workers_);
    MPI_Finalize();
  }
  std::shared_ptr<messaging::NetworkCollective> collective() override { return collective_; }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; should it, the rank still ends
  }

 private:
  MPI_Comm workers_;
  std::shared_ptr<messaging::NetworkCollective> collective_;
};

}  // namespace

Result<std::unique_ptr<MpiSession>> MpiSession::start(bool worker, unsigned index) {
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return Status::IOError("--collective mpi: MPI_Init_thread failed (is this rank started by mpirun?)");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return Status::IOError("--collective mpi: this Open MPI gives no MPI_THREAD_SERIALIZED");
  }
  MPI_Comm workers = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, worker ? 0 : MPI_UNDEFINED, static_cast<int>(index), &workers);
  std::shared_ptr<messaging::NetworkCollective> collective;
  if (worker) {
    int rank = 0, size = 0;
    MPI_Comm_rank(workers, &rank);
    MPI_Comm_size(workers, &size);
    collective = std::make_shared<MpiCollective>(workers, rank, size);
  }
  return std::unique_ptr<MpiSession>(new OpenMpiSession(workers, std::move(collective)));
}

}  // namespace asgd::cli
