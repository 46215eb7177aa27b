// What a parse error means, in words that say what to do (commands.hpp:
// explain_parse_error), for asgd and asgd-bench alike.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#include "base/flag_text.hpp"
#include "tools/asgd/commands.hpp"

namespace asgd::cli {
namespace {

// The long flags `scope` takes, as typed ("--workers").
std::vector<std::string> flags_of(const CLI::App& scope) {
  std::vector<std::string> flags;
  for (const CLI::Option* o : scope.get_options())
    for (const std::string& name : o->get_lnames()) flags.push_back("--" + name);
  return flags;
}

// The items of a comma-separated list; throws CLI's validation error for
// an empty one.
std::vector<std::string> list_items(const std::string& name, const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t begin = 0;;) {
    const std::size_t comma = text.find(',', begin);
    std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (item.empty())
      throw CLI::ValidationError(name, "'" + text + "': an empty item (two commas in a row, or one at an end)");
    out.push_back(std::move(item));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

}  // namespace

CLI::Option* add_list_option(CLI::App* app, const std::string& name, std::vector<std::string>& items,
                             const std::string& description) {
  return app
      ->add_option_function<std::string>(
          name, [&items, name](const std::string& text) { items = list_items(name, text); }, description)
      ->type_name("LIST");
}

CLI::Option* add_list_option(CLI::App* app, const std::string& name, std::vector<std::uint32_t>& items,
                             const std::string& description, std::uint32_t lo, std::uint32_t hi) {
  return app
      ->add_option_function<std::string>(
          name,
          [&items, name, lo, hi](const std::string& text) {
            std::vector<std::uint32_t> out;
            for (const std::string& item : list_items(name, text)) {
              std::uint32_t v = 0;
              const auto [at, err] = std::from_chars(item.data(), item.data() + item.size(), v);
              if (err != std::errc() || at != item.data() + item.size() || v < lo || v > hi)
                throw CLI::ValidationError(name, item + ": expected a whole number from " + std::to_string(lo) +
                                                     " to " + std::to_string(hi));
              out.push_back(v);
            }
            items = std::move(out);
          },
          description)
      ->type_name("LIST");
}

std::string explain_parse_error(CLI::App& app, const std::vector<std::string>& typed,
                                const CLI::ParseError& e) {
  // The deepest command given ("asgd data fetch"): its flags and commands.
  CLI::App* command = nullptr;
  std::string where = app.get_name();  // "asgd", "asgd bench"
  for (CLI::App* at = &app; !at->get_subcommands().empty();) {
    at = at->get_subcommands().back();
    command = at;
    where += " " + at->get_name();
  }
  // The first argument the command did not take that looks like a flag.
  const auto unknown_flag = [&]() -> std::string {
    const std::vector<std::string> flags = flags_of(command ? *command : app);
    for (auto it = typed.begin(); it != typed.end(); ++it) {
      if (!it->starts_with("--")) continue;
      const std::string flag = it->substr(0, it->find('='));
      if (std::find(flags.begin(), flags.end(), flag) != flags.end()) continue;
      const std::string best = nearest(flag, flags);
      return "unknown flag " + flag + (best.empty() ? "" : "; did you mean " + best + "?") + " (" + where +
             " --help lists them)";
    }
    return "";
  };
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    if (std::string said = unknown_flag(); !said.empty()) return said;
    return std::string(e.what()) + " (" + where + " --help lists what it takes)";
  }
  // A required flag misspelt: CLI11 checks what is required first, and said
  // "--policies is required" of `--polices async`.
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr)
    if (std::string said = unknown_flag(); !said.empty()) return said;
  // CLI11's "Could not convert: --repeats = -1": the flag, the value and what it takes.
  if (const std::string what = e.what(); dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    const std::string mark = "Could not convert: ";
    const auto eq = what.find(" = ");
    if (what.rfind(mark, 0) == 0 && eq != std::string::npos) {
      const std::string flag = what.substr(mark.size(), eq - mark.size());
      const CLI::App& scope = command ? *command : app;
      if (const CLI::Option* o = scope.get_option_no_throw(flag); o != nullptr && !o->get_type_name().empty())
        return flag + " " + what.substr(eq + 3) + ": not a valid " + o->get_type_name() + ": " + o->get_description();
      return flag + " " + what.substr(eq + 3) + ": not a value it takes (" + where + " --help says what it takes)";
    }
  }
  // CLI11's "--epochs: At Most 1 required but received 2": a flag given twice.
  if (const std::string what = e.what(); what.find(": At Most 1 required but received ") != std::string::npos)
    return what.substr(0, what.find(':')) + " given " + what.substr(what.rfind(' ') + 1) +
           " times; give it once (the last one does not win)";
  if (std::string(e.what()).find("subcommand is required") != std::string::npos) {
    const CLI::App& scope = command ? *command : app;
    std::vector<std::string> commands;
    std::string names;
    for (const CLI::App* sub : scope.get_subcommands({})) {
      if (sub->get_group().empty()) continue;  // hidden: a process's part, not the user's to type
      commands.push_back(sub->get_name());
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    // The first word past the commands given ("list" in asgd keys list).
    const std::size_t depth = static_cast<std::size_t>(std::count(where.begin(), where.end(), ' '));
    if (typed.size() <= depth) return "the commands: " + names + " (" + where + " --help says what each does)";
    const std::string& given = typed[depth];
    const std::string best = nearest(given, commands);
    return (given.starts_with("-") ? "unknown flag " : "unknown command ") + given + "; " +
           (best.empty() ? "" : "did you mean " + best + "? ") + "the commands: " + names + " (" + where +
           " --help says what each does)";
  }
  return e.what();
}

}  // namespace asgd::cli
