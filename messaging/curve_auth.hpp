#pragma once
// CurveZMQ keys for `--auth-keys` (docs/security.md): generating them,
// reading and writing them as files, the folder that is a process's
// allow-list, and the endpoint form that carries a server's public key.
// The transport that uses them is messaging/zmq_transport.cpp.
//
// Key files are text: optional comment lines starting with '#', and one
// line holding the key in Z85 (40 characters). NAME.key holds a secret key
// (mode 0600), NAME.pub the public key that goes with it.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "messaging/transport.hpp"

namespace asgd::messaging {

/// Whether the libzmq we run on was built with CURVE (libsodium).
bool curve_supported();

struct CurveKeypair {
  CurveKey public_key{};
  CurveKey secret_key{};
};

/// A fresh keypair. Errors: unavailable when libzmq has no CURVE.
Result<CurveKeypair> new_curve_keypair();

/// The public key that goes with `secret_key`. Errors: unavailable.
Result<CurveKey> curve_public_key(const CurveKey& secret_key);

/// Z85 text of a key (40 characters), and back (nullopt unless exactly 40
/// Z85 characters).
std::string to_z85(const CurveKey& key);
std::optional<CurveKey> from_z85(std::string_view text);

/// A short name for a public key in log lines: its first 12 Z85 characters,
/// which `grep -F` finds in the .pub file it came from.
std::string key_fingerprint(const CurveKey& public_key);

/// Reads a key file (format above). Errors naming the file: not_found when
/// it is missing, invalid_argument when it holds no key or more than one.
/// A secret key file readable by other users is accepted with a warning.
Result<CurveKey> read_public_key_file(const std::filesystem::path& file);
Result<CurveKeypair> read_secret_key_file(const std::filesystem::path& file);

struct KeyFiles {
  std::filesystem::path secret;  ///< DIR/NAME.key, mode 0600
  std::filesystem::path public_; ///< DIR/NAME.pub, mode 0644
};

/// Writes `keys` as DIR/NAME.key and DIR/NAME.pub, creating DIR (mode 0700)
/// if needed. NAME is letters, digits, '.', '_' and '-', not starting with
/// '.'. Refuses (invalid_argument naming the file) to replace an existing
/// file unless `overwrite`. Errors: invalid_argument, io_error.
Result<KeyFiles> write_key_files(const std::filesystem::path& dir, const std::string& name, const CurveKeypair& keys,
                                 bool overwrite);

/// Where a process finds its keys.
struct AuthKeysSpec {
  std::string dir;              ///< --auth-keys: every *.pub in it is allowed
  std::string key_file;         ///< --key: this process's secret key; empty: the one *.key in dir
  std::string server_key_file;  ///< --coordinator-key: empty: dir/coordinator.pub if there
};

/// The CURVE options for `spec`. Errors naming the folder or file:
/// not_found (no folder, no secret key, a missing file), invalid_argument
/// (a file that is not a key, no *.pub at all, several *.key and no --key),
/// unavailable (libzmq without CURVE).
Result<CurveOptions> load_auth_keys(const AuthKeysSpec& spec);

/// `endpoint` with the public key of the CURVE server listening there
/// appended as " curve:" and its 40 Z85 characters: what a transport's
/// bind() returns with CURVE on, what connect() takes, what a shard
/// announces to the coordinator and the coordinator hands to workers.
/// Neither endpoints nor Z85 contain spaces, so the split is unambiguous.
std::string with_server_key(const std::string& endpoint, const CurveKey& server_key);

/// Splits what with_server_key joined: the bare endpoint and the key.
/// Without a " curve:" suffix: the endpoint as is, nullopt. Errors:
/// invalid_argument for a suffix that is not a Z85 key.
Result<std::pair<std::string, std::optional<CurveKey>>> split_server_key(const std::string& endpoint);

/// Bounds how many lines a flood of events may log: up to `lines` in each
/// `window`; what is over is counted, and the next line allowed reports how
/// many were left out. Not thread-safe.
class LogBudget {
 public:
  using Clock = std::chrono::steady_clock;
  LogBudget(int lines, Clock::duration window) : lines_(lines), window_(window) {}

  /// Whether a line may be logged at `now`; when it may, `left_out` is set
  /// to the lines held back since the last one logged.
  bool allow(Clock::time_point now, std::uint64_t& left_out);
  /// Lines held back since the last one logged.
  std::uint64_t held_back() const { return held_back_; }

 private:
  int lines_;
  Clock::duration window_;
  Clock::time_point window_start_{};
  int used_ = 0;
  std::uint64_t held_back_ = 0;
};

}  // namespace asgd::messaging
