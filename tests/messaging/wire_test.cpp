#include "messaging/wire.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "messaging/messages.hpp"
#include "messaging/untrusted.hpp"

namespace asgd::messaging {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(Crc32c, MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(bytes_of("")), 0u);
  // Continuing a CRC over pieces equals one pass over the whole.
  EXPECT_EQ(crc32c(bytes_of("6789"), crc32c(bytes_of("12345"))), 0xE3069283u);
}

TEST(Crc32c, TheInterleavedPathAndTheFusedCopyAgreeWithByteAtATime) {
  // 100 KB takes the three-stream path with its shift tables; 7-byte
  // pieces never do.
  std::vector<std::byte> data(100'003);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  std::uint32_t piecewise = 0;
  for (std::size_t i = 0; i < data.size(); i += 7)
    piecewise = crc32c(std::span(data).subspan(i, std::min<std::size_t>(7, data.size() - i)), piecewise);
  EXPECT_EQ(crc32c(data), piecewise);
  std::vector<std::byte> copy(data.size());
  EXPECT_EQ(crc32c_copy(copy.data(), data), piecewise);
  EXPECT_EQ(copy, data);
}

TEST(Crc32c, TheFoldingPathAgreesAtEveryLengthAlignmentAndStartingValueAroundItsBlocks) {
  // Long inputs fold 256 bytes a step where the CPU has VPCLMULQDQ; the
  // rest, and short inputs, take the crc32 instruction; copies from 16 MiB
  // on are streamed around the cache. 7-byte pieces never fold.
  std::vector<std::byte> data((16u << 20) + 100);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 2654435761u) >> 11);
  for (std::size_t n : {1023u, 1024u, 1025u, 1279u, 1280u, 1281u, 1791u, 4096u, 12'345u, 65'536u + 17u,
                        (16u << 20) + 77u}) {
    for (std::size_t offset : {0u, 1u, 3u, 8u}) {
      const auto piece = std::span<const std::byte>(data).subspan(offset, n);
      for (std::uint32_t start : {0u, 0xDEADBEEFu}) {
        std::uint32_t piecewise = start;
        for (std::size_t i = 0; i < n; i += 7)
          piecewise = crc32c(piece.subspan(i, std::min<std::size_t>(7, n - i)), piecewise);
        ASSERT_EQ(crc32c(piece, start), piecewise) << n << " bytes at offset " << offset;
        std::vector<std::byte> copy(n + 1, std::byte{0x5A});
        ASSERT_EQ(crc32c_copy(copy.data() + 1, piece, start), piecewise) << n << " bytes at offset " << offset;
        ASSERT_TRUE(std::equal(piece.begin(), piece.end(), copy.begin() + 1));
        ASSERT_EQ(copy[0], std::byte{0x5A});
      }
    }
  }
}

TEST(Half, RoundTripsExactValuesAndRoundsToNearestEven) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(from_half(to_half(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(from_half(to_half(1e6f))));
  EXPECT_TRUE(std::isnan(from_half(to_half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(from_half(to_half(1.0f + 1.0f / 4096)), 1.0f);  // halfway below 1 + 2^-10: to even
  // The vector conversion (F16C where present) agrees with the scalar one.
  std::vector<float> in;
  for (int i = 0; i < 1000; ++i) in.push_back(std::ldexp(static_cast<float>(i) - 500.3f, (i % 40) - 30));
  std::vector<std::uint16_t> h(in.size());
  to_half(in, h);
  std::vector<float> back(in.size());
  from_half(h, back);
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(h[i], to_half(in[i])) << i;
    EXPECT_EQ(back[i], from_half(h[i])) << i;
  }
}

template <class M>
M round_trip(const M& m, std::vector<float> tensor = {}, std::vector<float>* tensor_out = nullptr,
             TensorCoding coding = TensorCoding::float32) {
  Message wire = encode(m, 77, std::move(tensor), coding);
  EXPECT_EQ(check_untrusted(wire), FrameError::none);
  Frame f;
  EXPECT_EQ(parse_frame(wire, f), FrameError::none);
  EXPECT_EQ(f.header.type, static_cast<std::uint16_t>(type_of<M>()));
  EXPECT_EQ(f.header.request_id, 77u);
  M out;
  EXPECT_EQ(decode(f, out), FrameError::none);
  if (tensor_out) {
    EXPECT_EQ(decode_tensor(f, *tensor_out), FrameError::none);
  }
  return out;
}

TEST(WireMessages, ABigPushIsCheckedWhereItLiesAndItsValuesReadOnlyWhenItsChecksumHolds) {
  std::vector<float> payload(kBorrowFromBytes / sizeof(float) + 3);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<float>(i) * 0.5f;
  Message wire = encode(PushRequest{1, 2, 1, 8, true, {}}, 9, payload);
  Frame f;
  ASSERT_EQ(parse_frame(wire, f), FrameError::none);
  ASSERT_TRUE(can_borrow_tensor(f));
  ReceivedFloats received;
  ASSERT_EQ(borrow_tensor(f, wire[1], received), FrameError::none);
  EXPECT_EQ(received.values.data(), reinterpret_cast<const float*>(wire[1].bytes.data())) << "copied, not borrowed";
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), received.values.begin(), received.values.end()));
  // The sender's own bytes (as inproc delivers them) are not written over.
  EXPECT_TRUE(received.writable.empty());
  EXPECT_EQ(received.spare.size(), payload.size());
  EXPECT_EQ(check_untrusted(wire), FrameError::none);
  // A fresh receive buffer is.
  wire[1].exclusive = true;
  ReceivedFloats own;
  ASSERT_EQ(borrow_tensor(f, wire[1], own), FrameError::none);
  EXPECT_EQ(own.writable.data(), own.values.data());
  EXPECT_EQ(own.writable.size(), payload.size());
  EXPECT_TRUE(own.spare.empty());

  std::vector<std::byte> damaged(wire[1].bytes.begin(), wire[1].bytes.end());
  damaged[damaged.size() / 2] ^= std::byte{1};
  wire[1] = Part::take(std::move(damaged));
  ASSERT_EQ(parse_frame(wire, f), FrameError::none);
  ReceivedFloats refused;
  EXPECT_EQ(borrow_tensor(f, wire[1], refused), FrameError::bad_checksum);
  EXPECT_EQ(refused.owner, nullptr);
  EXPECT_TRUE(refused.values.empty());
  EXPECT_EQ(check_untrusted(wire), FrameError::bad_checksum);

  // float16 and small tensors are converted or copied out as before.
  Message half = encode(PushRequest{1, 2, 1, 8, true, {}}, 9, payload, TensorCoding::float16);
  ASSERT_EQ(parse_frame(half, f), FrameError::none);
  EXPECT_FALSE(can_borrow_tensor(f));
  Message small = encode(PushRequest{1, 2, 1, 8, true, {}}, 9, {1.0f, 2.0f});
  ASSERT_EQ(parse_frame(small, f), FrameError::none);
  EXPECT_FALSE(can_borrow_tensor(f));
}

TEST(WireMessages, EveryMessageTypeRoundTrips) {
  Registration reg{Role::shard, 3, "tcp://10.0.0.2:4000", "host-a", 1234, "boot-id/f0", "rank 4 (SLURM_PROCID)",
                   "SLURM_JOB_ID=49 SLURM_STEP_ID=1"};
  auto r = round_trip(reg);
  EXPECT_EQ(r.role, Role::shard);
  EXPECT_EQ(r.index, 3u);
  EXPECT_EQ(r.endpoint, reg.endpoint);
  EXPECT_EQ(r.host, "host-a");
  EXPECT_EQ(r.pid, 1234u);
  EXPECT_EQ(r.cpu_key, "boot-id/f0");
  EXPECT_EQ(r.index_from, "rank 4 (SLURM_PROCID)");
  EXPECT_EQ(r.run, "SLURM_JOB_ID=49 SLURM_STEP_ID=1");

  Assignment a;
  a.role = Role::worker;
  a.index = 1;
  a.config = "policy = \"bsp\"\nworkers = 2\n";
  a.workers = 2;
  a.range_begin = 5;
  a.range_end = 9;
  a.partition_begin = 100;
  a.partition_end = 200;
  a.batch = 32;
  a.schedule_steps = 860;
  a.shard_endpoints = {"tcp://h:1", "tcp://h:2"};
  a.range_bounds = {0, 5, 9};
  a.restore = true;
  a.first_epoch = 3;
  a.cpu_sharers = 4;
  std::vector<float> initial;
  auto a2 = round_trip(a, {1.0f, 2.0f}, &initial);
  EXPECT_EQ(a2.config, a.config);
  EXPECT_EQ(a2.schedule_steps, 860u);
  EXPECT_EQ(a2.shard_endpoints, a.shard_endpoints);
  EXPECT_EQ(a2.range_bounds, a.range_bounds);
  EXPECT_EQ(a2.partition_end, 200u);
  EXPECT_TRUE(a2.restore);
  EXPECT_EQ(a2.first_epoch, 3u);
  EXPECT_EQ(a2.cpu_sharers, 4u);
  EXPECT_EQ(initial, (std::vector<float>{1.0f, 2.0f}));

  std::vector<float> payload;
  auto p = round_trip(PushRequest{2, 40, 38, 64, true, {}}, {0.5f, -1.5f, 3.0f}, &payload);
  EXPECT_EQ(p.worker, 2u);
  EXPECT_EQ(p.clock, 40u);
  EXPECT_EQ(p.base_clock, 38u);
  EXPECT_EQ(p.samples, 64u);
  EXPECT_TRUE(p.want_params);
  EXPECT_EQ(payload, (std::vector<float>{0.5f, -1.5f, 3.0f}));

  auto pull = round_trip(PullRequest{7, 9});
  EXPECT_EQ(pull.worker, 7u);
  EXPECT_EQ(pull.clock, 9u);

  ShardReply reply{1, static_cast<std::uint8_t>(PushOutcome::aggregated), 12, 99, 0.25, 4321, {}};
  std::vector<float> params;
  auto rr = round_trip(reply, {4.0f}, &params);
  EXPECT_EQ(rr.shard, 1u);
  EXPECT_EQ(rr.outcome, reply.outcome);
  EXPECT_EQ(rr.clock, 12u);
  EXPECT_EQ(rr.version, 99u);
  EXPECT_EQ(rr.held_s, 0.25);
  EXPECT_EQ(rr.applied, 4321u);
  EXPECT_EQ(params, (std::vector<float>{4.0f}));

  auto c = round_trip(ClockNotice{3, 17, true});
  EXPECT_EQ(c.worker, 3u);
  EXPECT_EQ(c.clock, 17u);
  EXPECT_TRUE(c.leaving);

  auto h = round_trip(Heartbeat{Role::worker, 2, 5});
  EXPECT_EQ(h.sequence, 5u);
  round_trip(EvaluationRequest{});
  EXPECT_EQ(round_trip(CheckpointRequest{"/tmp/ck"}).directory, "/tmp/ck");
  EXPECT_EQ(round_trip(Shutdown{"done"}).reason, "done");
  auto fl = round_trip(Failure{7, "diverged"});
  EXPECT_EQ(fl.code, 7);
  EXPECT_EQ(fl.what, "diverged");
  round_trip(StartTraining{});
  round_trip(StopTraining{});
  round_trip(StatsRequest{});
  auto cal = round_trip(Calibration{4, 0.0015, 2.5e-5});
  EXPECT_EQ(cal.index, 4u);
  EXPECT_EQ(cal.fixed_s, 0.0015);
  EXPECT_EQ(cal.per_sample_s, 2.5e-5);
  EXPECT_EQ(round_trip(WorkerReady{5}).index, 5u);
  auto rs = round_trip(Restarted{Role::shard, 3, "tcp://10.0.0.2:4100"});
  EXPECT_EQ(rs.role, Role::shard);
  EXPECT_EQ(rs.index, 3u);
  EXPECT_EQ(rs.endpoint, "tcp://10.0.0.2:4100");

  EpochReport er;
  er.worker = 1;
  er.epoch = 2;
  er.samples = 27500;
  er.loss_sum = 1234.5;
  er.policy_wait_s = 0.5;
  er.staleness_histogram = {10, 0, 3};
  er.dropped_samples = 64;
  auto er2 = round_trip(er);
  EXPECT_EQ(er2.samples, 27500u);
  EXPECT_EQ(er2.loss_sum, 1234.5);
  EXPECT_EQ(er2.staleness_histogram, er.staleness_histogram);
  EXPECT_EQ(er2.dropped_samples, 64u);

  ShardStats st;
  st.shard = 1;
  st.updates_applied = 10;
  st.commits = 5;
  st.rejected = 2;
  st.staleness_histogram = {4, 6};
  st.keys = 4096;
  st.held = 1;
  st.queued = 3;
  st.worker_clock = {12, 9};
  auto st2 = round_trip(st);
  EXPECT_EQ(st2.commits, 5u);
  EXPECT_EQ(st2.staleness_histogram, st.staleness_histogram);
  EXPECT_EQ(st2.keys, 4096u);
  EXPECT_EQ(st2.held, 1u);
  EXPECT_EQ(st2.queued, 3u);
  EXPECT_EQ(st2.worker_clock, st.worker_clock);

  WorkerProgress wp{1, 40, 2, 2560, 38, 12.5, 2496, 0.25, 1.5, 1};
  auto wp2 = round_trip(wp);
  EXPECT_EQ(wp2.worker, 1u);
  EXPECT_EQ(wp2.clock, 40u);
  EXPECT_EQ(wp2.epoch, 2u);
  EXPECT_EQ(wp2.samples, 2560u);
  EXPECT_EQ(wp2.updates, 38u);
  EXPECT_EQ(wp2.loss_sum, 12.5);
  EXPECT_EQ(wp2.loss_samples, 2496u);
  EXPECT_EQ(wp2.policy_wait_s, 0.25);
  EXPECT_EQ(wp2.staleness, 1.5);
  EXPECT_EQ(wp2.batches_ready, 1u);
}

TEST(WireMessages, NoPartOfALegalFrameIsLargerThanLargestPartSays) {
  // What a shard's endpoint is sent: a push of its key range, with the
  // largest body a frame may have in part 0.
  constexpr std::size_t kRange = 400'000;  // 1.6 MB of float32: the tensor is the larger part
  const Message push = encode(PushRequest{0, 0, 0, 1, true, {}}, 1, std::vector<float>(kRange, 1.0f));
  ASSERT_EQ(push.size(), 2u);
  EXPECT_LE(push[0].bytes.size(), largest_part(kRange));
  EXPECT_EQ(push[1].bytes.size(), largest_part(kRange));
  const std::vector<std::byte> body(kMaxBody);
  const Message widest = build_frame(1, 0, 1, body, Part{});
  EXPECT_EQ(widest[0].bytes.size(), largest_part(0)) << "a control frame at its limit";
  EXPECT_EQ(largest_part(10), largest_part(0)) << "a small tensor is smaller than part 0 may be";
}

TEST(WireMessages, Fp16HalvesTheTensorBytesAndKeepsValuesToHalfPrecision) {
  std::vector<float> g(1000);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::sin(static_cast<float>(i)) * 0.01f;
  Message f32 = encode(PushRequest{0, 0, 0, 1, false, {}}, 1, g, TensorCoding::float32);
  Message f16 = encode(PushRequest{0, 0, 0, 1, false, {}}, 1, g, TensorCoding::float16);
  ASSERT_EQ(f32.size(), 2u);
  ASSERT_EQ(f16.size(), 2u);
  EXPECT_EQ(f32[1].bytes.size(), 4000u);
  EXPECT_EQ(f16[1].bytes.size(), 2000u);
  Frame fr;
  ASSERT_EQ(parse_frame(f16, fr), FrameError::none);
  EXPECT_TRUE(fr.header.flags & kFlagFp16);
  std::vector<float> back;
  ASSERT_EQ(decode_tensor(fr, back, g.size()), FrameError::none);
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(back[i], g[i], std::abs(g[i]) * 1e-3f + 1e-7f) << i;
}

// A value past half precision's range (65504) made the whole push
// infinite, which the shard refused as a NaN: such a tensor goes as float32
// that once. An infinity or a NaN of its own stays what it is.
TEST(WireMessages, Fp16SendsATensorWithAValuePastItsRangeAsFloat32) {
  std::vector<float> g(100, 0.5f);
  g[7] = 70000.0f;
  EXPECT_FALSE(fits_half(g));
  Message m = encode(PushRequest{0, 0, 0, 1, false, {}}, 1, g, TensorCoding::float16);
  Frame fr;
  ASSERT_EQ(parse_frame(m, fr), FrameError::none);
  EXPECT_FALSE(fr.header.flags & kFlagFp16);
  std::vector<float> back;
  ASSERT_EQ(decode_tensor(fr, back, g.size()), FrameError::none);
  EXPECT_EQ(back, g);
  g[7] = 65519.0f;  // rounds to 65504: fits
  EXPECT_TRUE(fits_half(g));
  g[7] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(fits_half(g));
  g[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(fits_half(g));
  g[8] = -65520.0f;
  EXPECT_FALSE(fits_half(g));
}

// In place, a block at a time, as the scalar conversion rounds each value
// (the ring's last fold rounded value by value: 2.5 ms per 512K floats).
TEST(WireMessages, RoundToHalfGivesEachValueAsHalfPrecisionCarriesIt) {
  std::vector<float> v(10000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(static_cast<float>(i % 97) - 48.3f, static_cast<int>(i % 40) - 30);
  std::vector<float> want(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) want[i] = from_half(to_half(v[i]));
  round_to_half(v);
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], want[i]) << i;
}

TEST(WireMessages, AFloat32TensorIsSentWithoutCopying) {
  std::vector<float> g(1 << 20, 1.0f);
  const float* data = g.data();
  Message m = encode(PushRequest{}, 1, std::move(g));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(reinterpret_cast<const float*>(m[1].bytes.data()), data);
}

// Corruptions of a valid frame, each rejected for its reason.
class CorruptFrame : public ::testing::Test {
 protected:
  Message good = encode(PushRequest{1, 2, 3, 4, true, {}}, 9, {1.0f, 2.0f, 3.0f});
  std::vector<std::byte> head() const {
    return {good[0].bytes.begin(), good[0].bytes.end()};
  }
  Message with_head(std::vector<std::byte> h) const {
    Message m;
    m.push_back(Part::take(std::move(h)));
    m.push_back(good[1]);
    return m;
  }
};

TEST_F(CorruptFrame, EveryCheckRejectsWithItsReason) {
  EXPECT_EQ(check_untrusted({}), FrameError::no_parts);
  auto h = head();
  h.resize(10);
  EXPECT_EQ(check_untrusted(with_head(h)), FrameError::short_header);
  h = head();
  h[0] = std::byte{'X'};
  EXPECT_EQ(check_untrusted(with_head(h)), FrameError::bad_magic);
  h = head();
  h[4] = std::byte{kProtocolVersion + 1};  // a version this build does not speak
  EXPECT_EQ(check_untrusted(with_head(h)), FrameError::bad_version);
  h = head();
  const std::uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(h.data() + 24, &huge, 4);  // tensor length over the limit
  EXPECT_EQ(check_untrusted(with_head(h)), FrameError::oversized);
  h = head();
  h.push_back(std::byte{0});  // body longer than the header says
  EXPECT_EQ(check_untrusted(with_head(h)), FrameError::length_mismatch);
  h = head();
  h[8] |= std::byte{0x02};  // a flag bit no version defines (bit 0 is fp16), checked before the checksum
  EXPECT_EQ(check_untrusted(with_head(h)), FrameError::length_mismatch);
  h = head();
  h.back() ^= std::byte{0x40};  // a flipped bit in the body
  EXPECT_EQ(check_untrusted(with_head(h)), FrameError::bad_checksum);
  Message flipped_tensor;
  flipped_tensor.push_back(good[0]);
  std::vector<std::byte> t(good[1].bytes.begin(), good[1].bytes.end());
  t[5] ^= std::byte{0x10};
  flipped_tensor.push_back(Part::take(std::move(t)));
  EXPECT_EQ(check_untrusted(flipped_tensor), FrameError::bad_checksum);  // caught while copying it out
  Message truncated_tensor;
  truncated_tensor.push_back(good[0]);
  truncated_tensor.push_back(Part::copy_of(good[1].bytes.first(8)));
  EXPECT_EQ(check_untrusted(truncated_tensor), FrameError::length_mismatch);
}

TEST(WireMessages, ABodyThatClaimsAHugeListIsRejectedBeforeAllocating) {
  // A well-formed frame (valid checksum) whose body says the histogram has
  // 2^40 entries: the bound stops it before any resize.
  std::vector<std::byte> body = serialize_body([](cereal::PortableBinaryOutputArchive& ar) {
    EpochReport r;
    ar(r.worker, r.epoch, r.samples, r.batches, r.loss_sum, r.updates, r.compute_s, r.comm_s, r.data_wait_s,
       r.policy_wait_s, r.local_updates);
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(1) << 40));
  });
  Message m = build_frame(static_cast<std::uint16_t>(MsgType::epoch_report), 0, 1, body, {});
  EXPECT_EQ(check_untrusted(m), FrameError::bad_body);
}

TEST(WireMessages, TrailingBytesAndUnknownTypesAreRejected) {
  std::vector<std::byte> body = serialize_body([](cereal::PortableBinaryOutputArchive& ar) {
    PullRequest p{1, 2};
    archive_message(ar, p);
    std::uint8_t extra = 7;
    ar(extra);
  });
  EXPECT_EQ(check_untrusted(build_frame(static_cast<std::uint16_t>(MsgType::pull), 0, 1, body, {})),
            FrameError::bad_body);
  EXPECT_EQ(check_untrusted(build_frame(999, 0, 1, {}, {})), FrameError::unknown_type);
}

// Every input the fuzzer ever kept (tests/messaging/corpus) is replayed:
// each must be checked without crashing, and a valid seed must stay valid.
TEST(DecoderCorpus, EveryKeptFuzzInputIsHandled) {
  const std::filesystem::path dir = std::filesystem::path(ASGD_SOURCE_DIR) / "tests" / "messaging" / "corpus";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    (void)check_untrusted_bytes(bytes_of(data));
    ++files;
  }
  EXPECT_GT(files, 0u);
}

}  // namespace
}  // namespace asgd::messaging
