#include "serve/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>

#include "serve/rest.h"

namespace kiln::serve {
namespace {

using json = nlohmann::json;

const char* kModelPath = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

json tensor_list(const std::vector<TensorInfo>& ts) {
  json a = json::array();
  for (const TensorInfo& t : ts)
    a.push_back({{"name", t.name}, {"datatype", v2_datatype(t.dtype)}, {"shape", t.dims}});
  return a;
}

// A model's configuration as Triton's model_config JSON says it (what perf_analyzer and
// tritonclient's get_model_config read): dims past the batch when the model batches.
json triton_config(const ServedModel& m, const BatcherOptions& bo) {
  const bool batching = m.max_batch() > 1;
  auto tensors = [&](const std::vector<TensorInfo>& ts) {
    json a = json::array();
    for (const TensorInfo& t : ts) {
      std::vector<int64_t> dims = t.dims;
      if (batching && !dims.empty()) dims.erase(dims.begin());
      a.push_back({{"name", t.name}, {"data_type", fmt::format("TYPE_{}", v2_datatype(t.dtype))},
                   {"dims", dims}});
    }
    return a;
  };
  json c = {{"name", m.name()}, {"platform", "kiln"}, {"backend", "kiln"},
            {"max_batch_size", batching ? m.max_batch() : 0},
            {"input", tensors(m.engine().inputs())}, {"output", tensors(m.outputs())}};
  if (batching)
    c["dynamic_batching"] = {
        {"preferred_batch_size", bo.preferred},
        {"max_queue_delay_microseconds", static_cast<int64_t>(bo.max_delay_ms * 1000)}};
  return c;
}

void reply_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

void reply_error(httplib::Response& res, const ApiError& e) {
  reply_json(res, e.status, error_json(e.message));
}

std::string match(const httplib::Request& req, size_t i) {
  return i < req.matches.size() ? req.matches[i].str() : std::string();
}

}  // namespace

struct HttpServer::Impl {
  Core& core;
  HttpOptions opts;
  httplib::Server svr;
  Impl(Core& c, HttpOptions o) : core(c), opts(std::move(o)) {}

  void routes();
  void infer(const httplib::Request& req, httplib::Response& res);
  void shared_memory(const httplib::Request& req, httplib::Response& res);
  ModelEntry* model_or_reply(const httplib::Request& req, httplib::Response& res) {
    auto e = core.find(match(req, 1), match(req, 2));
    if (!e.ok()) {
      reply_error(res, e.error());
      return nullptr;
    }
    return *e;
  }
};

void HttpServer::Impl::routes() {
  svr.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) {
    reply_json(res, 200, "{\"live\":true}");
  });
  svr.Get("/v2/health/ready", [this](const httplib::Request&, httplib::Response& res) {
    if (core.ready()) reply_json(res, 200, "{\"ready\":true}");
    else reply_error(res, {503, "the server is shutting down"});
  });
  svr.Get("/v2", [](const httplib::Request&, httplib::Response& res) {
    json meta = {{"name", "kiln"}, {"version", KILN_VERSION_STRING},
                 {"extensions", {"binary_tensor_data", "system_shared_memory", "model_configuration"}}};
    reply_json(res, 200, meta.dump());
  });
  svr.Get(kModelPath, [this](const httplib::Request& req, httplib::Response& res) {
    ModelEntry* e = model_or_reply(req, res);
    if (!e) return;
    const ServedModel& m = *e->model;
    json meta = {{"name", m.name()}, {"versions", core.versions(m.name())}, {"platform", "kiln"},
                 {"inputs", tensor_list(m.engine().inputs())},
                 {"outputs", tensor_list(m.outputs())}};
    reply_json(res, 200, meta.dump());
  });
  svr.Get(fmt::format("{}/ready", kModelPath), [this](const httplib::Request& req, httplib::Response& res) {
    if (model_or_reply(req, res)) reply_json(res, core.ready() ? 200 : 503, "{}");
  });
  svr.Get(fmt::format("{}/config", kModelPath), [this](const httplib::Request& req, httplib::Response& res) {
    if (ModelEntry* e = model_or_reply(req, res))
      reply_json(res, 200, triton_config(*e->model, e->batcher->options()).dump());
  });
  svr.Post(fmt::format("{}/infer", kModelPath),
           [this](const httplib::Request& req, httplib::Response& res) { infer(req, res); });
  svr.Post("/v2/repository/index", [this](const httplib::Request&, httplib::Response& res) {
    json index = json::array();
    for (const auto& [name, versions] : core.models())
      for (const auto& [v, e] : versions)
        index.push_back({{"name", name}, {"version", std::to_string(v)}, {"state", "READY"}});
    reply_json(res, 200, index.dump());
  });
  auto shm = [this](const httplib::Request& req, httplib::Response& res) { shared_memory(req, res); };
  for (const char* p : {R"(/v2/systemsharedmemory(/.*)?)", R"(/v2/cudasharedmemory(/.*)?)"}) {
    svr.Get(p, shm);
    svr.Post(p, shm);
  }
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(core.metrics_text(), "text/plain; version=0.0.4");
  });
  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      const std::string length = req.get_header_value("Content-Length");
      reply_json(res, 413, error_json(fmt::format(
          "request body{} is over this server's limit of {} bytes (kiln serve "
          "--max-request-bytes)", length.empty() ? std::string() : fmt::format(" of {} bytes", length),
          opts.max_request_bytes)));
    } else if (res.status == 404) {
      reply_json(res, 404, error_json(fmt::format("no such endpoint: {} {}", req.method,
                                                  req.path.substr(0, 200))));
    } else {
      reply_json(res, res.status, error_json(fmt::format("HTTP status {}", res.status)));
    }
  });
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    core.count_response("http", res.status);
    if (opts.log_requests)
      std::fprintf(stderr, "kiln serve: %s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
  });
}

void HttpServer::Impl::infer(const httplib::Request& req, httplib::Response& res) {
  auto found = core.find(match(req, 1), match(req, 2));
  if (!found.ok()) return reply_error(res, found.error());
  // The body is this handler's to keep: binary tensors are read where they lie in it, and the
  // request holds it until the batch that reads them has run (no copy).
  auto body = std::make_shared<const std::string>(std::move(const_cast<httplib::Request&>(req).body));
  std::optional<std::string> header_length;
  if (req.has_header("Inference-Header-Content-Length"))
    header_length = req.get_header_value("Inference-Header-Content-Length");
  auto decoded = decode_rest_infer(body, header_length, core.shm());
  if (!decoded.ok()) return reply_error(res, decoded.error());
  InferRequest r = std::move(decoded).value();
  r.model = match(req, 1);
  r.version = match(req, 2);
  struct Answer {
    InferRequest req;
    Result<Outputs> outputs = Outputs{};
  };
  std::promise<Answer> promise;
  auto future = promise.get_future();
  core.infer(std::move(r), [&promise](InferRequest& rq, Result<Outputs> out) {
    promise.set_value(Answer{std::move(rq), std::move(out)});
  });
  Answer a = future.get();
  if (!a.outputs.ok()) return reply_error(res, a.outputs.error());
  auto entry = core.find(a.req.model, a.req.version);
  auto encoded = encode_rest_infer(a.req, *(*entry)->model, *a.outputs, core.shm());
  if (!encoded.ok()) return reply_error(res, encoded.error());
  res.status = 200;
  if (encoded->json_length) {
    res.set_header("Inference-Header-Content-Length", std::to_string(*encoded->json_length));
    res.set_content(std::move(encoded->body), "application/octet-stream");
  } else {
    res.set_content(std::move(encoded->body), "application/json");
  }
}

void HttpServer::Impl::shared_memory(const httplib::Request& req, httplib::Response& res) {
  static const std::regex kPath(
      R"(/v2/(systemsharedmemory|cudasharedmemory)(?:/region/([^/]+))?/(status|register|unregister))");
  std::smatch m;
  if (!std::regex_match(req.path, m, kPath))
    return reply_error(res, {404, fmt::format("no such shared memory endpoint: {}", req.path.substr(0, 200))});
  const std::string kind = m[1], name = m[2], action = m[3];
  const std::string want = action == "status" ? "GET" : "POST";
  if (req.method != want)
    return reply_error(res, {405, fmt::format("{} takes {}, not {}", req.path, want, req.method)});
  if (kind == "cudasharedmemory") return reply_error(res, {400, kCudaShmUnsupported});
  ShmRegistry& reg = core.shm();
  if (action == "status") {
    auto st = reg.status(name);
    if (!st.ok()) return reply_error(res, st.error());
    json a = json::array();
    for (const RegionStatus& r : *st)
      a.push_back({{"name", r.name}, {"key", r.key}, {"offset", r.offset}, {"byte_size", r.byte_size}});
    return reply_json(res, 200, a.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  if (action == "unregister") {
    reg.unregister(name);
    return reply_json(res, 200, "");
  }
  if (name.empty())
    return reply_error(res, {404, "register takes a region name: "
                                  "/v2/systemsharedmemory/region/NAME/register"});
  json body;
  try {
    body = json::parse(req.body.empty() ? std::string("null") : req.body);
  } catch (const json::exception& e) {
    return reply_error(res, {400, fmt::format("malformed register request: {}", e.what())});
  }
  if (!body.is_object() || !body.contains("key") || !body.contains("byte_size"))
    return reply_error(res, {400, "malformed register request: the body must be a JSON object with "
                                  "\"key\" and \"byte_size\" (and \"offset\")"});
  auto whole = [](const json& v) {
    return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  };
  auto repr = [](const json& v) {
    return v.is_string() ? fmt::format("'{}'", v.get<std::string>()) : v.dump();
  };
  const json& size = body["byte_size"];
  const json offset = body.contains("offset") ? body["offset"] : json(0);
  if (!body["key"].is_string())
    return reply_error(res, {400, fmt::format("shared memory key {} is not a string", repr(body["key"]))});
  if (!whole(size))
    return reply_error(res, {400, fmt::format("byte_size {} is not a whole number of bytes", repr(size))});
  if (!whole(offset))
    return reply_error(res, {400, fmt::format("offset {} is not a whole number of bytes", repr(offset))});
  if (Check c = reg.register_region(name, body["key"].get<std::string>(), offset.get<uint64_t>(),
                                    size.get<uint64_t>()))
    return reply_error(res, *c);
  reply_json(res, 200, "");
}

std::string port_problem(const std::string& host, int port, const char* what) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string service = std::to_string(port);
  if (const int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); e != 0)
    return fmt::format("cannot listen on {}:{} ({}): {}", host, port, what, gai_strerror(e));
  std::string problem;
  const int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  int yes = 1;
  // As the servers bind: SO_REUSEADDR, so a port in TIME_WAIT is not taken, one listened on is.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (fd < 0 || ::bind(fd, found->ai_addr, found->ai_addrlen) != 0)
    problem = fmt::format("cannot listen on {}:{} ({}): {}", host, port, what, std::strerror(errno));
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return problem;
}

HttpServer::HttpServer(Core& core, HttpOptions options)
    : impl_(std::make_unique<Impl>(core, std::move(options))) {
  Impl& s = *impl_;
  const int threads = std::max(s.opts.threads, 1);
  s.svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.svr.set_payload_max_length(s.opts.max_request_bytes);
  s.svr.set_keep_alive_max_count(1000);
  s.svr.set_keep_alive_timeout(5);
  s.svr.set_tcp_nodelay(true);
  s.routes();
}

HttpServer::~HttpServer() = default;

Status HttpServer::bind() {
  if (impl_->opts.port == 0) {
    impl_->opts.port = impl_->svr.bind_to_any_port(impl_->opts.host);
    if (impl_->opts.port > 0) return Status::Ok();
  }
  if (impl_->opts.port <= 0 || !impl_->svr.bind_to_port(impl_->opts.host, impl_->opts.port))
    return KILN_ERROR("cannot listen on {}:{} (REST): the port is taken or the address is not "
                      "this machine's", impl_->opts.host, impl_->opts.port);
  return Status::Ok();
}

int HttpServer::port() const { return impl_->opts.port; }

void HttpServer::serve() { impl_->svr.listen_after_bind(); }

void HttpServer::stop() { impl_->svr.stop(); }

}  // namespace kiln::serve
