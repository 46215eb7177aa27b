#pragma once
// Device and pinned host memory, streams and events for the CUDA backend,
// and the batch uploader behind DeviceModel::prefetch. Every owner here is
// move-only and frees its resource on destruction (errors there are
// ignored: a destructor has nobody to tell). All other failures throw
// asgd::cuda::Error. Not thread-safe; the current device must be the
// owner's device whenever one of these is used or destroyed.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace asgd::cuda {

/// Memory from cudaMalloc (device) or cudaMallocHost (pinned host, which
/// asynchronous copies need). Grows on demand and never shrinks: reserve()
/// reallocates only when asked for more than it holds, so a steady batch
/// size allocates once. Growing drops the contents.
template <bool Pinned>
class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { release(); }
  Buffer(Buffer&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// Makes room for at least `bytes`. Growing frees the old memory at once,
  /// so no queued work may still use it: the DeviceModel grows buffers only
  /// at the start of a call, after the previous call synchronised.
  void reserve(std::size_t bytes);

  std::size_t bytes() const { return bytes_; }
  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void release() noexcept;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};
using DeviceBuffer = Buffer<false>;
using PinnedBuffer = Buffer<true>;

/// A non-blocking stream (no implicit synchronisation with stream 0).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& other) noexcept : s_(std::exchange(other.s_, nullptr)) {}
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

/// An event, for ordering work between streams; with `timing`, also for
/// measuring the time between two of them on the device (elapsed_s).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept : e_(std::exchange(other.e_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

/// Seconds between two timing events' moments on the device, once `to` has
/// completed.
double elapsed_s(const Event& from, const Event& to);

/// Hands out aligned slices of one allocation: the device memory pool of a
/// DeviceModel. A layout function calls take() for every buffer a step
/// needs; it runs once with a null base to measure, then again over an
/// allocation of at least the measured size to assign pointers.
class Carver {
 public:
  explicit Carver(std::byte* base) : base_(base) {}

  /// count elements of T, 256-byte aligned (what cuDNN and cuBLAS prefer);
  /// null while measuring.
  template <class T>
  T* take(std::size_t count) {
    const std::size_t at = (used_ + kAlign - 1) / kAlign * kAlign;
    used_ = at + count * sizeof(T);
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  std::size_t used() const { return used_; }

 private:
  static constexpr std::size_t kAlign = 256;
  std::byte* base_;
  std::size_t used_ = 0;
};

/// Uploads training batches (x and optional int32 labels y) through pinned
/// staging buffers. Two slots: one can be filling on the copy stream
/// (prefetch) while the other feeds the compute stream. A prefetched batch
/// is recognised by content, not address, so a caller that refills one host
/// buffer between prefetch and use still gets its new data.
class BatchUploader {
 public:
  /// Device pointers to an uploaded batch; valid until the next prefetch()
  /// or acquire() that reuses its slot.
  struct DeviceBatch {
    const float* x = nullptr;
    const std::int32_t* y = nullptr;
  };

  BatchUploader() = default;

  /// Starts copying x and y to the device on the uploader's own stream and
  /// returns at once (after a host copy into pinned memory). Requires that
  /// no queued compute still reads the slot it reuses: the DeviceModel
  /// synchronises its compute stream before every call returns.
  void prefetch(std::span<const float> x, std::span<const std::int32_t> y);

  /// The batch on the device for work queued on `compute`: a prefetched
  /// copy when one holds exactly this x and y (the compute stream then waits
  /// for that copy), otherwise a fresh upload queued on `compute`.
  DeviceBatch acquire(std::span<const float> x, std::span<const std::int32_t> y, cudaStream_t compute);

 private:
  struct Slot {
    PinnedBuffer host_x, host_y;
    DeviceBuffer dev_x, dev_y;
    Event copied;  // recorded after the slot's last upload
    std::size_t x_count = 0, y_count = 0;
    bool filled = false;    // holds a batch (host and device copies agree)
    bool pending = false;   // prefetched and not yet used
    std::uint64_t age = 0;  // fill order, to pick the older slot
    bool holds(std::span<const float> x, std::span<const std::int32_t> y) const;
  };
  Slot* find(std::span<const float> x, std::span<const std::int32_t> y);
  Slot& victim();
  void fill(Slot& slot, std::span<const float> x, std::span<const std::int32_t> y, cudaStream_t stream);

  Slot slots_[2];
  std::uint64_t fills_ = 0;
  // Last, so destroyed first: its destructor waits for the copies into the
  // slots' buffers before they are freed.
  Stream copy_stream_;
};

}  // namespace asgd::cuda
