#pragma once
// JSON text that never throws on what users give it: names of models,
// datasets and paths may hold bytes that are not UTF-8, and nlohmann's
// dump() throws on those by default (on a job's thread that ended the
// host, issue 27). Every JSON asgd writes goes through here.

#include <string>

#include <nlohmann/json.hpp>

namespace asgd {

/// `j` as JSON text; a byte sequence that is not UTF-8 becomes U+FFFD.
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace asgd
