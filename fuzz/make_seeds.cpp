// Writes one valid frame of every message type (in the fuzz target's input
// layout: a split byte, then the bytes) into the folder given, as seeds.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "messaging/messages.hpp"

namespace m = asgd::messaging;

namespace {

void write(const std::filesystem::path& dir, const std::string& name, const m::Message& msg) {
  std::ofstream out(dir / name, std::ios::binary);
  const bool two = msg.size() == 2;
  out.put(static_cast<char>((two ? 1 : 0) | 2));  // bit 1: the fuzz entry fixes the checksum up
  if (two) {
    const auto head = static_cast<std::uint16_t>(msg[0].bytes.size());
    out.write(reinterpret_cast<const char*>(&head), 2);
  }
  for (const auto& p : msg) out.write(reinterpret_cast<const char*>(p.bytes.data()), static_cast<std::streamsize>(p.bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  m::Assignment a;
  a.config = "policy = \"async\"\n";
  a.shard_endpoints = {"tcp://127.0.0.1:5000"};
  a.range_bounds = {0, 10};
  asgd::EpochReport er;
  er.staleness_histogram = {1, 2, 3};
  asgd::ShardStats st;
  st.staleness_histogram = {5};
  write(dir, "registration", m::encode(m::Registration{m::Role::shard, 1, "tcp://127.0.0.1:1", "h", 1, "boot/3", ""}, 1));
  write(dir, "assignment", m::encode(a, 2, {1.0f, 2.0f}));
  write(dir, "push", m::encode(asgd::PushRequest{0, 1, 0, 64, true, {}}, 3, {0.5f, 0.25f, -1.0f}));
  write(dir, "push_fp16", m::encode(asgd::PushRequest{0, 1, 0, 64, true, {}}, 3, {0.5f, 0.25f, -1.0f},
                                    m::TensorCoding::float16));
  write(dir, "pull", m::encode(asgd::PullRequest{1, 2}, 4));
  write(dir, "parameters", m::encode(asgd::ShardReply{0, 1, 2, 3, 0.0, 4, {}}, 5, {1.0f}));
  write(dir, "clock", m::encode(m::ClockNotice{1, 2, true}, 6));
  write(dir, "heartbeat", m::encode(m::Heartbeat{m::Role::worker, 1, 9}, 7));
  write(dir, "evaluation", m::encode(m::EvaluationRequest{}, 8));
  write(dir, "checkpoint", m::encode(m::CheckpointRequest{"/tmp/c"}, 9));
  write(dir, "shutdown", m::encode(m::Shutdown{"bye"}, 10));
  write(dir, "epoch_report", m::encode(er, 11));
  write(dir, "failure", m::encode(m::Failure{1, "x"}, 12));
  write(dir, "stats_request", m::encode(m::StatsRequest{}, 13));
  write(dir, "stats", m::encode(st, 13));
  write(dir, "start", m::encode(m::StartTraining{}, 14));
  write(dir, "progress", m::encode(asgd::WorkerProgress{1, 40, 0, 2560, 40, 12.5, 2560, 0.1, 1.0, 1}, 15));
  write(dir, "calibration", m::encode(m::Calibration{1, 0.0015, 2.5e-5}, 17));
  write(dir, "worker_ready", m::encode(m::WorkerReady{3}, 18));
  write(dir, "stop_training", m::encode(m::StopTraining{}, 19));
  write(dir, "restarted", m::encode(m::Restarted{m::Role::shard, 1, "tcp://127.0.0.1:5555"}, 16));
  return 0;
}
