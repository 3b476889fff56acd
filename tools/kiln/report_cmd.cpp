// kiln report: one self-contained HTML page of plots and tables from the JSON results that
// `kiln bench --export-json`, `kiln compare --export-json` and bench/run_suite.sh write. The
// plotting is scripts/report.py (matplotlib); this command finds it and runs it.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "cli.h"

extern char** environ;

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

// $KILN_REPORT_SCRIPT, else scripts/report.py next to the binary's folder (build/kiln ->
// scripts/report.py), else in the source tree this binary was built from.
Expected<std::string> find_script() {
  if (const char* env = std::getenv("KILN_REPORT_SCRIPT")) return std::string(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> tries;
  if (!ec)
    tries = {exe.parent_path().parent_path() / "scripts/report.py",
             exe.parent_path() / "scripts/report.py"};
  tries.push_back(fs::path(KILN_SOURCE_DIR) / "scripts/report.py");
  for (const auto& p : tries)
    if (fs::is_regular_file(p, ec)) return p.string();
  return Status::Error("cannot find scripts/report.py (set KILN_REPORT_SCRIPT to its path)");
}

// Runs argv; stderr is captured and its last line becomes the error when the exit status is
// not 0 (the script reports its errors as one line).
Status run_captured(const std::vector<std::string>& args) {
  int pipe_fd[2];
  if (pipe(pipe_fd) != 0) return Status::Error("report: cannot create a pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipe_fd[1], 2);
  posix_spawn_file_actions_addclose(&fa, pipe_fd[0]);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(pipe_fd[1]);
  std::string err;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(pipe_fd[0], buf, sizeof(buf))) > 0) err.append(buf, static_cast<size_t>(n));
  close(pipe_fd[0]);
  if (rc != 0) return KILN_ERROR("report: cannot run {}: {}", args[0], std::strerror(rc));
  int status = 0;
  waitpid(pid, &status, 0);
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    if (!err.empty()) std::cerr << err << "\n";  // warnings
    return Status::Ok();
  }
  const std::string last =
      err.substr(err.find_last_of('\n') == std::string::npos ? 0 : err.find_last_of('\n') + 1);
  return KILN_ERROR("report: {}", last.empty() ? "scripts/report.py failed" : last);
}

}  // namespace

Runner add_report_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("report", "Plots and tables of bench/compare results as one HTML page");
  struct Opts {
    std::string dir, out = "report.html", title, plots;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("results", o->dir,
                  "Folder of *.json results (kiln bench/compare --export-json, bench/run_suite.sh)")
      ->required();
  cmd->add_option("-o,--output", o->out, "The HTML file to write (default report.html)");
  cmd->add_option("--title", o->title, "Page title");
  cmd->add_option("--save-plots", o->plots,
                  "Also write each plot as DIR/<model>_<kind>.png (the README's plot comes from here)");
  return [o]() -> Status {
    std::error_code ec;
    if (!fs::is_directory(o->dir, ec))
      return KILN_ERROR("report: '{}' is not a folder of results", o->dir);
    KILN_ASSIGN_OR_RETURN(std::string script, find_script());
    const char* py = std::getenv("PYTHON");
    std::vector<std::string> args = {py && *py ? py : "python3", script, o->dir, "-o", o->out};
    if (!o->title.empty()) args.insert(args.end(), {"--title", o->title});
    if (!o->plots.empty()) args.insert(args.end(), {"--save-plots", o->plots});
    KILN_RETURN_IF_ERROR(run_captured(args));
    std::cout << "wrote " << o->out << "\n";
    return Status::Ok();
  };
}

}  // namespace kiln::cli
