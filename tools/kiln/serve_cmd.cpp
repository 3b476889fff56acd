// kiln serve: every engine of a model repository over the Open Inference Protocol (v2), HTTP/REST
// and gRPC, in one process for every device (src/serve/: the core, its batcher, the front ends).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "cli.h"
#include "serve/device.h"
#include "serve/http_server.h"
#include "serve/memory.h"
#include "serve/server.h"
#ifdef KILN_SERVE_GRPC
#include "serve/grpc_server.h"
#endif

namespace kiln::cli {
namespace {

struct ServeFlags {
  std::string repository, host = "0.0.0.0", devices, pad_batches, preferred;
  int http_port = 8080, grpc_port = 8081, contexts = 0, max_batch = 0, http_threads = 0;
  double delay_ms = 2.0;
  size_t max_request_bytes = 64u << 20, max_queue = 4096;
  bool no_grpc = false, log_requests = false, no_warmup = false, spin_wait = false;
  bool delay_when_idle = false;
  int priority_levels = 0, default_priority = 0;
  CLI::Option* pad = nullptr;
};

Expected<std::vector<int>> parse_sizes(const std::string& text, const char* flag) {
  std::vector<int> out;
  for (const std::string& item : split_list(text)) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > (1 << 20))
      return KILN_ERROR("{} takes batch sizes such as 4,8,16, not '{}'", flag, text);
    out.push_back(static_cast<int>(v));
  }
  return out;
}

Status run_serve(const ServeFlags& f) {
  // SIGTERM and SIGINT are taken by sigwait below: blocked before any thread starts, so that
  // every thread inherits the mask and none is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that goes away mid-answer is the front end's to handle

  const std::string wait = serve::set_gpu_wait(f.spin_wait);
  if (!wait.empty()) return Status::Error(wait);
  serve::CoreOptions co;
  co.repository = f.repository;
  KILN_ASSIGN_OR_RETURN(co.devices, serve::parse_devices(f.devices, serve::visible_gpus()));
  co.max_batch_cap = f.max_batch;
  co.pad = f.pad && f.pad->count() > 0;
  co.pad_batches = f.pad_batches;
  if (co.pad) KILN_RETURN_IF_ERROR(serve::parse_pad_sizes(co.pad_batches, 1 << 20).status());
  co.batcher.contexts = f.contexts;
  co.batcher.max_delay_ms = f.delay_ms;
  co.batcher.max_queue = f.max_queue;
  co.batcher.warm = !f.no_warmup;
  co.batcher.delay_when_idle = f.delay_when_idle;
  co.batcher.priority_levels = f.priority_levels;
  co.batcher.default_priority = f.default_priority;
  if (f.default_priority > f.priority_levels)
    return KILN_ERROR("--default-priority-level {} is past --priority-levels {}",
                      f.default_priority, f.priority_levels);
  KILN_ASSIGN_OR_RETURN(co.batcher.preferred, parse_sizes(f.preferred, "--preferred-batch-sizes"));
  auto log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  for (auto [port, what] :
       {std::pair{f.http_port, "REST"}, std::pair{f.no_grpc ? -1 : f.grpc_port, "gRPC"}}) {
    if (port < 0) continue;
    const std::string problem = serve::port_problem(f.host, port, what);
    if (!problem.empty()) return Status::Error(problem);
  }
  KILN_ASSIGN_OR_RETURN(auto core, serve::Core::load(co, log));
  serve::MemoryWatch memory(log);

  serve::HttpServer http(
      *core, {f.host, f.http_port, f.max_request_bytes, f.http_threads, f.log_requests});
  KILN_RETURN_IF_ERROR(http.bind());
#ifdef KILN_SERVE_GRPC
  std::unique_ptr<serve::GrpcServer> grpc;
  if (!f.no_grpc) {
    grpc = std::make_unique<serve::GrpcServer>(
        *core, serve::GrpcOptions{f.host, f.grpc_port, f.max_request_bytes, f.log_requests});
    KILN_RETURN_IF_ERROR(grpc->start());
    log(fmt::format("gRPC (Open Inference Protocol v2) on {}:{}", f.host, f.grpc_port));
  }
#else
  if (!f.no_grpc)
    log("kiln serve: this build has no gRPC front end (grpc++ was not found): REST only");
#endif
  std::thread http_thread([&] { http.serve(); });
  log(fmt::format("REST (Open Inference Protocol v2) on {}:{}", f.host, f.http_port));
  log("kiln serve: ready");

  int sig = 0;
  sigwait(&stop_signals, &sig);
  // Graceful drain: readiness says no at once, the listeners close, the requests taken are
  // answered (their batches run), then the process exits.
  log(fmt::format("kiln serve: {}: draining", sig == SIGTERM ? "SIGTERM" : "SIGINT"));
  std::thread drain([&] { core->drain(); });
#ifdef KILN_SERVE_GRPC
  if (grpc) grpc->stop();
#endif
  http.stop();
  http_thread.join();
  drain.join();
  log("kiln serve: stopped");
  return Status::Ok();
}

}  // namespace

Runner add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "serve",
      "Serve every engine in a model repository over the Open Inference Protocol (v2), "
      "HTTP/REST and gRPC");
  auto f = std::make_shared<ServeFlags>();
  cmd->add_option("model_repository", f->repository,
                  "Folder of engines: NAME.kiln, NAME/model.kiln or NAME/VERSION/model.kiln")
      ->required();
  cmd->add_option("--http-port", f->http_port, "REST port (default 8080)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--grpc-port", f->grpc_port, "gRPC port (default 8081)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--host", f->host, "Address to listen on (default 0.0.0.0: every one)");
  if (const char* env = std::getenv("KILN_SERVE_CONTEXTS")) f->contexts = std::atoi(env);
  cmd->add_option("--contexts", f->contexts,
                  "Execution contexts per model and device: batches run concurrently "
                  "(default 4 on a GPU, 2 for a cpu engine)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--max-batch-size", f->max_batch,
                  "Join concurrent requests up to this many samples (default: the engine "
                  "profile's maximum batch, else 32)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--batch-delay-ms", f->delay_ms,
                  "How long the oldest request waits for others to join its batch (default 2)")
      ->check(CLI::Range(0.0, 10000.0));
  cmd->add_flag("--delay-when-idle", f->delay_when_idle,
                "Wait out --batch-delay-ms even when no context of the model is running (by "
                "default such a request runs at once: nothing is running for others to queue "
                "behind)");
  cmd->add_option("--preferred-batch-sizes", f->preferred,
                  "Hand a batch over as soon as it reaches the largest of these sizes, and cut "
                  "one at a size of these when the delay ends (Triton's preferred_batch_size)");
  cmd->add_option("--priority-levels", f->priority_levels,
                  "Queue requests by their 'priority' parameter: level 1 runs first, then 2, "
                  "... up to this (Triton's priority_levels; default 0: one level for all)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--default-priority-level", f->default_priority,
                  "The level of a request without a priority (default: the middle level)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-request-bytes", f->max_request_bytes,
                  "Largest request body, REST and gRPC (default 64 MiB; more gets 413)")
      ->check(CLI::Range(static_cast<size_t>(1024), static_cast<size_t>(1) << 40));
  cmd->add_option("--max-queue", f->max_queue,
                  "Requests a model may hold waiting (default 4096; more get 429)")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(1) << 24));
  cmd->add_option("--http-threads", f->http_threads,
                  "Threads of the HTTP front end's I/O (default: a quarter of the cores, 2 to 8; "
                  "connections are not bound to threads)")
      ->check(CLI::Range(0, 256));
  cmd->add_flag("--no-grpc", f->no_grpc, "REST only");
  cmd->add_option("--devices", f->devices,
                  "GPUs to serve from, e.g. 0,1: each loads every engine and keeps --contexts "
                  "contexts of it (default: every visible GPU; cpu engines run once)");
  f->pad = cmd->add_option("--pad-batches", f->pad_batches,
                           "Pad each batch to the smallest of these sizes that holds it (e.g. "
                           "1,2,4,8; alone: powers of two up to the maximum batch)")
               ->expected(0, 1)
               ->default_str("pow2");
  cmd->add_flag("--log-requests", f->log_requests, "Log every request on stderr");
  cmd->add_flag("--no-warmup", f->no_warmup,
                "Take requests without first running each context at the sizes it will see");
  cmd->add_flag("--spin-wait", f->spin_wait,
                "Threads waiting for the GPU spin (trtexec's --useSpinWait) instead of sleeping");
  return [f]() { return run_serve(*f); };
}

}  // namespace kiln::cli
