// Shared pieces of the kiln command-line tool.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kiln/engine.h"
#include "kiln/status.h"

namespace kiln::cli {

// Parses "name:1x3x224x224,other:4x8" into a ShapeMap. Names may contain ':' (the last ':'
// separates the dims).
Expected<ShapeMap> parse_shapes(const std::string& spec, const std::string& flag);

// Each subcommand registers its options on `app` and returns the function that runs it.
using Runner = std::function<Status()>;
Runner add_build_command(CLI::App& app);
Runner add_run_command(CLI::App& app);
Runner add_inspect_command(CLI::App& app);

}  // namespace kiln::cli
