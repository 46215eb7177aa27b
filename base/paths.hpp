#pragma once
// What is at a path, without throwing. std::filesystem's calls without an
// error_code throw where a path cannot be looked at (a symbolic link loop,
// a folder without search permission), and an uncaught filesystem_error
// ends the program with SIGABRT instead of one line naming the path.

#include <filesystem>
#include <string>
#include <system_error>

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

}  // namespace asgd
