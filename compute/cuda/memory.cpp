#include "compute/cuda/memory.hpp"

#include <cstring>

#include "compute/cuda/check.hpp"

namespace asgd::cuda {

template <bool Pinned>
void Buffer<Pinned>::reserve(std::size_t bytes) {
  if (bytes <= bytes_) return;
  release();
  if constexpr (Pinned) {
    ASGD_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
  } else {
    ASGD_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  bytes_ = bytes;
}

template <bool Pinned>
void Buffer<Pinned>::release() noexcept {
  if (!ptr_) return;
  if constexpr (Pinned) {
    cudaFreeHost(ptr_);
  } else {
    cudaFree(ptr_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

template class Buffer<false>;
template class Buffer<true>;

Stream::Stream() { ASGD_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  // Whatever still runs on it (a copy into a buffer about to be freed) ends
  // first: cudaFree only waits for the legacy default stream's work.
  if (s_) {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
}
void Stream::synchronize() const { ASGD_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  ASGD_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}

double elapsed_s(const Event& from, const Event& to) {
  float ms = 0.0f;
  ASGD_CUDA_CHECK(cudaEventElapsedTime(&ms, from.get(), to.get()));
  return static_cast<double>(ms) / 1e3;
}

// ---- BatchUploader ----------------------------------------------------------

bool BatchUploader::Slot::holds(std::span<const float> x, std::span<const std::int32_t> y) const {
  // Comparing the pinned copy costs a host memcmp (tens of microseconds for
  // a typical batch), far less than the upload it saves.
  return filled && x_count == x.size() && y_count == y.size() &&
         (x.empty() || std::memcmp(host_x.data(), x.data(), x.size_bytes()) == 0) &&
         (y.empty() || std::memcmp(host_y.data(), y.data(), y.size_bytes()) == 0);
}

BatchUploader::Slot* BatchUploader::find(std::span<const float> x, std::span<const std::int32_t> y) {
  for (Slot& slot : slots_)
    if (slot.holds(x, y)) return &slot;
  return nullptr;
}

BatchUploader::Slot& BatchUploader::victim() {
  // Keep a prefetched batch that has not been used yet if the other slot is
  // free to take; otherwise the older one goes.
  Slot& a = slots_[0];
  Slot& b = slots_[1];
  if (a.pending != b.pending) return a.pending ? b : a;
  return a.age <= b.age ? a : b;
}

void BatchUploader::fill(Slot& slot, std::span<const float> x, std::span<const std::int32_t> y, cudaStream_t stream) {
  // The pinned buffers may still be the source of this slot's last upload.
  ASGD_CUDA_CHECK(cudaEventSynchronize(slot.copied.get()));
  slot.filled = false;
  slot.host_x.reserve(x.size_bytes());
  slot.host_y.reserve(y.size_bytes());
  slot.dev_x.reserve(x.size_bytes());
  slot.dev_y.reserve(y.size_bytes());
  if (!x.empty()) std::memcpy(slot.host_x.data(), x.data(), x.size_bytes());
  if (!y.empty()) std::memcpy(slot.host_y.data(), y.data(), y.size_bytes());
  if (!x.empty())
    ASGD_CUDA_CHECK(
        cudaMemcpyAsync(slot.dev_x.data(), slot.host_x.data(), x.size_bytes(), cudaMemcpyHostToDevice, stream));
  if (!y.empty())
    ASGD_CUDA_CHECK(
        cudaMemcpyAsync(slot.dev_y.data(), slot.host_y.data(), y.size_bytes(), cudaMemcpyHostToDevice, stream));
  ASGD_CUDA_CHECK(cudaEventRecord(slot.copied.get(), stream));
  slot.x_count = x.size();
  slot.y_count = y.size();
  slot.filled = true;
  slot.age = ++fills_;
}

void BatchUploader::prefetch(std::span<const float> x, std::span<const std::int32_t> y) {
  if (Slot* slot = find(x, y)) {  // already there (or on its way)
    slot->pending = true;
    return;
  }
  Slot& slot = victim();
  fill(slot, x, y, copy_stream_.get());
  slot.pending = true;
}

BatchUploader::DeviceBatch BatchUploader::acquire(std::span<const float> x, std::span<const std::int32_t> y,
                                                  cudaStream_t compute) {
  Slot* slot = find(x, y);
  if (slot) {
    ASGD_CUDA_CHECK(cudaStreamWaitEvent(compute, slot->copied.get(), 0));
  } else {
    slot = &victim();
    fill(*slot, x, y, compute);
  }
  slot->pending = false;
  return {slot->dev_x.as<const float>(), slot->dev_y.as<const std::int32_t>()};
}

}  // namespace asgd::cuda
