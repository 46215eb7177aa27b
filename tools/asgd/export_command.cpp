// asgd export: a trained model's checkpoint as a safetensors file, with the
// tensor names of the equivalent torch.nn module.

#include <filesystem>
#include <memory>

#include "actors/checkpoint.hpp"
#include "runtime/checkpointed_model.hpp"
#include "runtime/config_file.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {

namespace {

namespace fs = std::filesystem;

// The files of a checkpointed job beside its model.ckpt: job.toml and
// shard-K.ckpt, which --resume reads, and shard-K.ckpt.claim, which says
// which process of shard K writes its checkpoint.
bool job_file(const std::string& name) { return is_checkpoint_folder_file(name) && name != kCheckpointFile; }

// --checkpoint names one of those files instead of the trained model: a
// usage error that says which file to give (it was "not an asgd
// checkpoint", exit 1, as for a damaged model).
Status check_checkpoint_path(const std::string& checkpoint) {
  const std::string name = fs::path(checkpoint).filename().string();
  if (!job_file(name)) return {};
  return Status::InvalidArgument("--checkpoint " + checkpoint + ": " + name +
                                 " is a file of the checkpointed job, not its trained model; give the job's "
                                 "--checkpoint-dir (its model.ckpt is written when the job ends)");
}

// Where --out may go: a new file or a regular one (replaced), in a folder
// that exists, neither the checkpoint it is made from nor a file of a
// checkpoint folder.
Status check_export_path(const std::string& out, const std::string& checkpoint) {
  if (out.empty()) return Status::InvalidArgument("--out: empty; give the .safetensors file to write");
  std::error_code ec;
  const fs::path path(out);
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))
    return Status::InvalidArgument("--out " + out + ": exists and is not a regular file (" +
                                   (fs::is_directory(st) ? "a folder" : "a device, pipe or socket") +
                                   "); give a file name");
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, ec))
    return Status::InvalidArgument("--out " + out + ": the folder " + folder.string() + " does not exist");
  fs::path source(checkpoint);
  if (fs::is_directory(source, ec)) source /= kCheckpointFile;
  if (fs::exists(st) && fs::equivalent(path, source, ec))
    return Status::InvalidArgument("--out " + out + ": is the checkpoint being exported; give another file");
  // Nor a name of a checkpoint folder's files, in any folder: it replaced
  // another job's model.ckpt or job.toml, which --resume, asgd export and
  // the job's shards read.
  if (const std::string name = path.filename().string(); is_checkpoint_folder_file(name))
    return Status::InvalidArgument("--out " + out + ": " + name +
                                   " is the name of a checkpointed job's own file (asgd export, --resume or its "
                                   "shards read it); give a .safetensors file");
  return {};
}

}  // namespace

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
    if (Status s = check_checkpoint_path(o->checkpoint); !s.ok()) {
      print_error(s.message());
      return kExitUsage;
    }
    if (Status s = check_export_path(o->out, o->checkpoint); !s.ok()) {
      print_error(s.message());
      return kExitUsage;
    }
    auto ckpt = read_checkpoint(o->checkpoint);
    if (!ckpt) {
      print_error(ckpt.status().message());
      return ckpt.status().code() == StatusCode::not_found ? kExitUsage : kExitFailure;
    }
    // What torch would load into the wrong tensors, or not at all: refused.
    if (auto model = checkpointed_model(*ckpt, o->checkpoint); !model) {
      print_error(model.status().message());
      return kExitFailure;
    }
    const auto written = write_safetensors(o->out, *ckpt);
    if (!written) {
      print_error(written.status().message());
      return kExitFailure;
    }
    std::printf("wrote %s: %s trained on %s, %zu tensors, %zu bytes\n", o->out.c_str(), ckpt->model.c_str(),
                ckpt->dataset.c_str(), written->tensors, written->bytes);
    return kExitOk;
  };
}

}  // namespace asgd::cli
