#include "actors/data_feeder.hpp"
#include "actors/thrown.hpp"

namespace asgd {

namespace {
constexpr std::uint64_t kAugmentStream = 0x6175670000000000;  // "aug"
}  // namespace

BatchSource::BatchSource(FeederSetup setup) : setup_(std::move(setup)), epoch_(setup_.first_epoch) {
  if (!exhausted()) start_epoch();
}

void BatchSource::start_epoch() {
  const std::size_t n = setup_.partition.size();
  order_ = data::shuffled_order(n, setup_.seed, setup_.stream, epoch_);
  for (auto& i : order_) i += setup_.partition.begin;
  pos_ = 0;
  index_ = 0;
}

data::Batch BatchSource::next() {
  data::Batch batch;
  if (exhausted() || order_.empty()) {
    epoch_ = setup_.epochs;
    return batch;
  }
  const std::size_t take = std::min<std::size_t>(setup_.batch, order_.size() - pos_);
  data::gather_batch(setup_.data->train, std::span(order_).subspan(pos_, take), batch);
  batch.epoch = epoch_;
  batch.index = index_++;
  if (setup_.augment.any()) {
    // Its own stream, apart from the shuffles': a batch's augmentation
    // depends only on (seed, worker, epoch, batch), whatever came before.
    Rng rng(mix_seed(setup_.seed, setup_.stream ^ kAugmentStream, (batch.epoch << 32) | batch.index));
    data::augment_batch(batch, setup_.data->train, setup_.data->normalization, setup_.augment, rng);
  }
  pos_ += take;
  batch.last_in_epoch = pos_ == order_.size();
  if (batch.last_in_epoch && ++epoch_ < setup_.epochs) start_epoch();
  return batch;
}

caf::behavior data_feeder(caf::stateful_actor<FeederState>* self, FeederSetup setup) {
  // Answers every worker still waiting for a batch: with the end-of-data
  // marker (an empty batch), or an error.
  auto answer_waiting = [self](const auto& answer) {
    for (auto& p : self->state.waiting) p.deliver(answer);
    self->state.waiting.clear();
  };
  // A batch that cannot be made (out of memory) still answers the worker
  // waiting for it, with the error: a promise dropped unanswered would
  // leave that worker's request open for good.
  self->set_exception_handler([answer_waiting](caf::scheduled_actor*, std::exception_ptr& thrown) -> caf::error {
    const caf::error failed = thrown_error(thrown, "a data feeder");
    answer_waiting(failed);
    return failed;
  });
  auto& st = self->state;
  st.capacity = std::max<std::uint32_t>(1, setup.capacity);
  st.source = std::make_unique<BatchSource>(std::move(setup));
  auto schedule = [self] {
    auto& s = self->state;
    if (!s.producing && !s.stopped && !s.source->exhausted() && s.ready.size() < s.capacity) {
      s.producing = true;
      self->send(self, produce_atom::value);
    }
  };
  schedule();
  return {
      [self, schedule](next_atom) -> caf::result<data::Batch> {
        auto& s = self->state;
        if (!s.ready.empty()) {
          data::Batch b = std::move(s.ready.front());
          s.ready.pop_front();
          schedule();
          return b;
        }
        if (s.stopped || s.source->exhausted()) return data::Batch{};
        s.waiting.push_back(self->make_response_promise());
        schedule();
        return caf::delegated<data::Batch>();
      },
      [self, answer_waiting](stop_atom) {
        self->state.stopped = true;
        self->state.ready.clear();
        answer_waiting(data::Batch{});
      },
      [self, schedule, answer_waiting](produce_atom) {
        auto& s = self->state;
        s.producing = false;
        if (s.stopped || s.source->exhausted()) {
          answer_waiting(data::Batch{});
          return;
        }
        data::Batch b = s.source->next();
        if (!s.waiting.empty()) {
          s.waiting.front().deliver(std::move(b));
          s.waiting.pop_front();
        } else {
          s.ready.push_back(std::move(b));
        }
        schedule();
      },
  };
}

}  // namespace asgd
