// `asgd keys generate`: a CurveZMQ keypair for --auth-keys (docs/security.md).

#include <cstdio>
#include <memory>
#include <string>

#include "messaging/curve_auth.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

std::function<int()> add_keys_command(CLI::App& app) {
  struct Options {
    std::string out;
    std::string name;
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  auto* keys = app.add_subcommand("keys", "CurveZMQ keys for --auth-keys (docs/security.md)");
  keys->require_subcommand(1);
  auto* generate = keys->add_subcommand(
      "generate", "write a new keypair: DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub (public)");
  generate->add_option("--out", o->out, "the folder to write to (created, mode 0700, if missing)")
      ->type_name("DIR")
      ->required();
  generate->add_option("--name", o->name, "the keypair's name: letters, digits, '.', '_', '-' (e.g. the host's name)")
      ->type_name("NAME")
      ->required();
  generate->add_flag("--force", o->force, "replace an existing keypair of that name (its holders are then refused)");
  return [o]() -> int {
    auto pair = messaging::new_curve_keypair();
    if (!pair) {
      print_error("keys generate: " + pair.status().message());
      return kExitFailure;
    }
    auto files = messaging::write_key_files(o->out, o->name, *pair, o->force);
    if (!files) {
      print_error(files.status().message());
      return exit_code_for(files.status());
    }
    std::printf("wrote %s (secret: keep it on this host)\n", files->secret.c_str());
    std::printf("wrote %s (public: copy it into the --auth-keys folder of every process that should admit %s)\n",
                files->public_.c_str(), o->name.c_str());
    std::printf("fingerprint %s\n", messaging::key_fingerprint(pair->public_key).c_str());
    return kExitOk;
  };
}

}  // namespace asgd::cli
