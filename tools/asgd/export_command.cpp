// asgd export: a trained model's checkpoint as a safetensors file, with the
// tensor names of the equivalent torch.nn module.

#include <filesystem>
#include <memory>

#include "actors/checkpoint.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

std::function<int()> add_export_command(CLI::App& app) {
  struct Options {
    std::string checkpoint;
    std::string out;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("export", "write a trained model as safetensors (names match torch.nn)");
  cmd->add_option("--checkpoint", o->checkpoint, "the job's --checkpoint-dir (or its model.ckpt)")
      ->type_name("PATH")
      ->required();
  cmd->add_option("--out", o->out, "the .safetensors file to write")->type_name("FILE")->required();
  return [o] {
    auto ckpt = read_checkpoint(o->checkpoint);
    if (!ckpt) {
      print_error(ckpt.status().message());
      return ckpt.status().code() == StatusCode::not_found ? kExitUsage : kExitFailure;
    }
    if (const Status s = write_safetensors(o->out, *ckpt); !s.ok()) {
      print_error(s.message());
      return kExitFailure;
    }
    std::size_t tensors = ckpt->params.size() + ckpt->buffers.size();
    std::printf("wrote %s: %s trained on %s, %zu tensors, %ju bytes\n", o->out.c_str(), ckpt->model.c_str(),
                ckpt->dataset.c_str(), tensors, static_cast<std::uintmax_t>(std::filesystem::file_size(o->out)));
    return kExitOk;
  };
}

}  // namespace asgd::cli
