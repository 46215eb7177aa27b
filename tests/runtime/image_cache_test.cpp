// resolve_image_cache (include/asgd/job.hpp): where loading a dataset keeps
// decompressed copies of its image files, read from the environment.

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "asgd/job.hpp"

namespace asgd {
namespace {

TEST(ResolveImageCache, ComesFromAsgdCacheDirThenXdgThenHomeAndOffTurnsItOff) {
  struct Saved {
    const char* name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* name : {"ASGD_CACHE_DIR", "XDG_CACHE_HOME", "HOME"}) {
    const char* v = std::getenv(name);
    saved.push_back({name, v ? std::optional<std::string>(v) : std::nullopt});
  }
  setenv("ASGD_CACHE_DIR", "/srv/cache", 1);
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(resolve_image_cache(), "/srv/cache");
  for (const char* off : {"off", "OFF", "0", "no", "False"}) {
    setenv("ASGD_CACHE_DIR", off, 1);
    EXPECT_EQ(resolve_image_cache(), "") << off;
  }
  unsetenv("ASGD_CACHE_DIR");
  EXPECT_EQ(resolve_image_cache(), "/xdg/asgd");
  setenv("XDG_CACHE_HOME", "relative/cache", 1);  // ignored, as the XDG rules say
  EXPECT_EQ(resolve_image_cache(), "/home/u/.cache/asgd");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(resolve_image_cache(), "/home/u/.cache/asgd");
  unsetenv("HOME");
  EXPECT_EQ(resolve_image_cache(), "");
  for (const auto& s : saved) {
    if (s.value) {
      setenv(s.name, s.value->c_str(), 1);
    } else {
      unsetenv(s.name);
    }
  }
}

}  // namespace
}  // namespace asgd
