#pragma once
// What is at a path, without throwing. std::filesystem's calls without an
// error_code throw where a path cannot be looked at (a symbolic link loop,
// a folder without search permission), and an uncaught filesystem_error
// ends the program with SIGABRT instead of one line naming the path.

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "asgd/status.hpp"

namespace asgd {

enum class PathKind {
  missing,     ///< nothing there
  folder,      ///< a directory (or a link to one)
  file,        ///< a regular file (or a link to one)
  other,       ///< a device, pipe or socket
  unreadable,  ///< cannot be looked at: PathLook::error says why
};

struct PathLook {
  PathKind kind = PathKind::missing;
  std::string error;  ///< for unreadable: "Permission denied", "Too many levels of symbolic links"
};

inline PathLook look_at(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return {};
  if (ec) return {PathKind::unreadable, ec.message()};
  if (std::filesystem::is_directory(st)) return {PathKind::folder, {}};
  if (std::filesystem::is_regular_file(st)) return {PathKind::file, {}};
  return {PathKind::other, {}};
}

/// Whether `path` (none when empty) can be written: an existing file this
/// process may write, or a new one in a folder it may write in. Errors:
/// invalid_argument saying why not ("its folder x does not exist").
inline Status writable_file(const std::string& path) {
  if (path.empty()) return {};
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return Status::InvalidArgument("a folder, not a file");
  if (fs::exists(path, ec))
    return ::access(path.c_str(), W_OK) == 0 ? Status{} : Status::InvalidArgument("this process may not write it");
  const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) return Status::InvalidArgument("its folder " + parent.string() + " does not exist");
  if (::access(parent.c_str(), W_OK) != 0)
    return Status::InvalidArgument("this process may not write in its folder " + parent.string());
  return {};
}

}  // namespace asgd
