#pragma once
// asgd data fetch: a dataset's files from its official location (or a
// mirror), each checked against the checksum compiled in here, written
// atomically and resumed where a download broke off. HTTP is libcurl's,
// the digests OpenSSL's.
//
// A file FILE is downloaded into DIR/FILE.part (kept when the transfer
// breaks off, so the next run asks for the rest with a Range request), then
// fsync'd, checked, and renamed to DIR/FILE; a copy whose checksum does not
// match is deleted, so no file under its final name is ever unchecked.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stop_token>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd::cli {

/// One file of a dataset as its authors publish it.
struct RemoteFile {
  std::string name;       ///< "train-images-idx3-ubyte.gz"
  std::uint64_t bytes;    ///< its exact size
  std::string algorithm;  ///< "sha256", or "md5" where the authors publish only that
  std::string digest;     ///< lower-case hex
};

/// A dataset `asgd data fetch` knows: its files and where they are.
struct RemoteDataset {
  std::string name;                   ///< "mnist"
  std::vector<std::string> bases;     ///< base URLs, official first, then mirrors; each ends in '/'
  std::vector<RemoteFile> files;
  /// After the download: a tar.gz among `files` whose members are unpacked
  /// into the folder (CIFAR-10's binary batches); empty: none.
  std::string unpack;
  std::vector<RemoteFile> members;    ///< what `unpack` must yield (digest empty: checked by size)
};

/// mnist, fashion-mnist, cifar10.
const std::vector<RemoteDataset>& remote_datasets();
/// The entry for `name`, or null.
const RemoteDataset* find_remote_dataset(const std::string& name);

struct FetchOptions {
  std::filesystem::path dir;   ///< the dataset's folder (created)
  std::string mirror;          ///< replaces every base URL when set
  double stall_timeout_s = 60; ///< a transfer that moves no byte for this long fails
  bool progress = false;       ///< draw a progress bar on stderr (a terminal)
  std::stop_token stop;        ///< Ctrl-C: the transfer stops, its .part stays for a resume
  /// One line per event ("mnist: train-images-idx3-ubyte.gz: ..."), for stdout.
  std::function<void(const std::string&)> say;
};

/// Fetches every file of `dataset` that is not already present and valid.
/// Errors (each message names the file and what to do): unavailable (no
/// base URL answered, naming each and why; or another fetch holds the
/// folder), corruption (a checksum that did not match from every base, a
/// resumed copy having been fetched whole once more), io_error (the folder
/// or a file in it cannot be written: no other server is tried), cancelled
/// (interrupted: run again to resume).
Status fetch_dataset(const RemoteDataset& dataset, const FetchOptions& options);

/// The hex digest (`algorithm`: "sha256" or "md5") of the file at `path`.
/// Errors: not_found, io_error.
Result<std::string> file_digest(const std::filesystem::path& path, const std::string& algorithm);

}  // namespace asgd::cli
