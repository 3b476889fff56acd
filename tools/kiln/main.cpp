// kiln: build, run, bench, inspect, compare, report on, serve and load inference engines. Subcommands live in one file each.
#include <cstdio>
#include <iostream>
#include <new>

#include "cli.h"

namespace {

// Errors may quote names read from a file: keep the message on one line and free of control
// characters.
std::string one_line(std::string s) {
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    else if (u < 0x20 || u == 0x7f) c = '?';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

int fail(const std::string& msg) {
  std::cerr << "kiln: error: " << one_line(msg) << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    CLI::App app{"kiln: an ONNX inference optimizer and runtime"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION_STRING);
    std::map<CLI::App*, kiln::cli::Runner> runners;
    for (auto add : {kiln::cli::add_build_command, kiln::cli::add_run_command,
                     kiln::cli::add_inspect_command, kiln::cli::add_bench_command,
                     kiln::cli::add_compare_command, kiln::cli::add_report_command,
                     kiln::cli::add_serve_command, kiln::cli::add_perf_command}) {
      const size_t before = app.get_subcommands({}).size();
      kiln::cli::Runner r = add(app);
      runners[app.get_subcommands({})[before]] = std::move(r);
    }
    if (argc > 1 && argv[1][0] != '-') {  // CLI11 would only say "A subcommand is required"
      bool known = false;
      for (auto& [sub, run] : runners) known = known || sub->get_name() == argv[1];
      if (!known)
        return fail(std::string("unknown subcommand '") + argv[1] +
                    "' (subcommands: build, run, bench, inspect, compare, report, serve, perf; try --help)");
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help / --version
      return fail(e.what());
    }
    for (auto& [sub, run] : runners) {
      if (!sub->parsed()) continue;
      kiln::Status st = run();
      if (!st.ok()) return fail(st.message());
      return 0;
    }
    return fail("no subcommand given (try --help)");
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  } catch (const std::exception& e) {
    return fail(std::string("internal error: ") + e.what());
  }
}
