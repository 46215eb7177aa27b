// asgd data fetch: downloads a dataset into the folder `asgd train` reads it
// from (tools/asgd/fetch.hpp does the work).

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "tools/asgd/commands.hpp"
#include "tools/asgd/fetch.hpp"

namespace asgd::cli {

std::function<int()> add_data_command(CLI::App& app) {
  struct Options {
    std::string name;
    std::string data_dir;
    std::string mirror;
    double stall_timeout_s = 60;
  };
  auto o = std::make_shared<Options>();
  auto* data = app.add_subcommand("data", "datasets: fetch one into the folder asgd train reads");
  data->require_subcommand(1);
  std::string names;
  for (const RemoteDataset& d : remote_datasets()) names += (names.empty() ? "" : ", ") + d.name;
  auto* fetch = data->add_subcommand(
      "fetch", "download a dataset (" + names + "), each file checked against its compiled-in checksum");
  fetch->add_option("name", o->name, "the dataset: " + names)->required()->type_name("NAME");
  fetch->add_option("--data-dir", o->data_dir, "its folder (default $ASGD_DATA_DIR/NAME, else ./data/NAME)")
      ->type_name("DIR");
  fetch->add_option("--mirror", o->mirror, "download from this base URL instead of the official ones (and mirrors)")
      ->type_name("URL")  // refused empty (refuse_mistyped_flags): --mirror "$UNSET" meant the official servers
      ->check(CLI::Validator(
          [](std::string& url) -> std::string {  // a typo said "check the network", exit 1
            if (url.empty()) return {};  // refuse_mistyped_flags says it
            for (const char* scheme : {"http://", "https://", "file://"})  // what libcurl here speaks
              if (url.starts_with(scheme) && url.size() > std::string(scheme).size()) return {};
            return "'" + url + "' is not a URL this can download from (http://, https:// or file://)";
          },
          ""));
  fetch->add_option("--stall-timeout", o->stall_timeout_s,
                    "give up on a server that sends nothing for this many seconds, 0.001 to 86400 (default 60)")
      ->type_name("S")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            if (end != text.c_str() && *end == '\0' && v >= 0.001 && v <= 86400.0) return {};
            return "expected a number of seconds from 0.001 to 86400, got " + text;
          },
          ""));
  return [o, names] {
    const RemoteDataset* d = find_remote_dataset(o->name);
    if (!d) {
      print_error("asgd data fetch " + o->name + ": no such dataset (known: " + names + ")");
      return kExitUsage;
    }
    JobConfig where;
    where.dataset = d->name;
    where.data_dir = o->data_dir;
    Interrupts interrupts;
    FetchOptions fo;
    fo.dir = resolve_data_dir(where);
    fo.mirror = o->mirror;
    fo.stall_timeout_s = o->stall_timeout_s;
    fo.progress = ::isatty(STDERR_FILENO) == 1;
    fo.stop = interrupts.token();
    fo.say = [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    };
    if (const Status s = fetch_dataset(*d, fo); !s.ok()) {
      print_error("asgd data fetch " + d->name + ": " + s.message());
      return kExitFailure;
    }
    std::printf("%s is in %s (asgd train --dataset %s%s)\n", d->name.c_str(), fo.dir.c_str(), d->name.c_str(),
                o->data_dir.empty() ? "" : (" --data-dir " + o->data_dir).c_str());
    return kExitOk;
  };
}

}  // namespace asgd::cli
