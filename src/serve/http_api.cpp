#include "serve/http_api.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "serve/rest.h"

namespace kiln::serve {
namespace {

using json = nlohmann::json;

HttpReply reply_json(int status, std::string body) {
  return HttpReply{status, "application/json", std::move(body), {}};
}
HttpReply reply_error(const ApiError& e) { return reply_json(e.status, error_json(e.message)); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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
      a.push_back({{"name", t.name},
                   {"data_type", fmt::format("TYPE_{}", v2_datatype(t.dtype))},
                   {"dims", dims}});
    }
    return a;
  };
  json c = {{"name", m.name()},
            {"platform", "kiln"},
            {"backend", "kiln"},
            {"max_batch_size", batching ? m.max_batch() : 0},
            {"input", tensors(m.engine().inputs())},
            {"output", tensors(m.outputs())}};
  if (batching)
    c["dynamic_batching"] = {
        {"preferred_batch_size", bo.preferred},
        {"max_queue_delay_microseconds", static_cast<int64_t>(bo.max_delay_ms * 1000)}};
  return c;
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool path_segments(const std::string& target, std::vector<std::string>* out) {
  out->clear();
  const std::string path = target.substr(0, target.find('?'));
  std::string seg;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (i > 0) out->push_back(std::move(seg));
      seg.clear();
    } else if (path[i] == '%') {
      if (i + 2 >= path.size() || hex(path[i + 1]) < 0 || hex(path[i + 2]) < 0) return false;
      seg += static_cast<char>(hex(path[i + 1]) * 16 + hex(path[i + 2]));
      i += 2;
    } else {
      seg += path[i];
    }
  }
  return true;
}

HttpReply HttpApi::too_large(uint64_t length) const {
  return reply_json(
      413,
      error_json(fmt::format(
          "request body{} is over this server's limit of {} bytes (kiln serve --max-request-bytes)",
          length ? fmt::format(" of {} bytes", length) : std::string(), limit_)));
}

void HttpApi::handle(HttpRequest req, std::function<void(HttpReply)> send) {
  std::vector<std::string> p;
  if (!path_segments(req.target, &p))
    return send(reply_error({400, "malformed request: a percent escape in the path is not one"}));
  const bool get = req.method == "GET", post = req.method == "POST";
  auto not_found = [&] {
    send(reply_error({404, fmt::format("no such endpoint: {} {}", req.method.substr(0, 10),
                                       req.target.substr(0, 200))}));
  };
  if (p.size() == 1 && p[0] == "metrics" && get)
    return send(HttpReply{200, "text/plain; version=0.0.4", core_.metrics_text(), {}});
  if (p.empty() || p[0] != "v2") return not_found();
  if (p.size() == 1 && get) {
    json meta = {{"name", "kiln"},
                 {"version", KILN_VERSION_STRING},
                 {"extensions",
                  {"binary_tensor_data", "system_shared_memory", "cuda_shared_memory",
                   "schedule_policy", "model_configuration"}}};
    return send(reply_json(200, dump(meta)));
  }
  if (p.size() == 3 && p[1] == "health" && get) {
    if (p[2] == "live") return send(reply_json(200, "{\"live\":true}"));
    if (p[2] == "ready")
      return send(core_.ready() ? reply_json(200, "{\"ready\":true}")
                                : reply_error({503, "the server is shutting down"}));
  }
  if (p.size() == 3 && p[1] == "repository" && p[2] == "index" && post) {
    json index = json::array();
    for (const auto& [name, versions] : core_.models())
      for (const auto& [v, e] : versions)
        index.push_back({{"name", name}, {"version", std::to_string(v)}, {"state", "READY"}});
    return send(reply_json(200, dump(index)));
  }
  if (p.size() >= 2 && (p[1] == "systemsharedmemory" || p[1] == "cudasharedmemory"))
    return send(shared_memory(req, req.target.substr(0, req.target.find('?'))));
  if (p.size() >= 3 && p[1] == "models") {
    // /v2/models/NAME[/versions/V][/ready|/config|/infer]
    const std::string& name = p[2];
    std::string version;
    size_t at = 3;
    if (p.size() >= 5 && p[3] == "versions") version = p[4], at = 5;
    if (p.size() > at + 1) return not_found();
    const std::string action = p.size() == at + 1 ? p[at] : "";
    if (action == "infer" && post) return infer(req, name, version, std::move(send));
    if (!get || (action != "" && action != "ready" && action != "config")) return not_found();
    auto e = core_.find(name, version);
    if (!e.ok()) return send(reply_error(e.error()));
    const ServedModel& m = *(*e)->model;
    if (action == "ready") return send(reply_json(core_.ready() ? 200 : 503, "{}"));
    if (action == "config")
      return send(reply_json(200, dump(triton_config(m, (*e)->batcher->options()))));
    json meta = {{"name", m.name()},
                 {"versions", core_.versions(m.name())},
                 {"platform", "kiln"},
                 {"inputs", tensor_list(m.engine().inputs())},
                 {"outputs", tensor_list(m.outputs())}};
    return send(reply_json(200, dump(meta)));
  }
  not_found();
}

void HttpApi::infer(HttpRequest& req, const std::string& model, const std::string& version,
                    std::function<void(HttpReply)> send) {
  auto found = core_.find(model, version);
  if (!found.ok()) return send(reply_error(found.error()));
  // The body is the request's to keep: binary tensors are read where they lie in it until the
  // batch that reads them has run (no copy).
  auto body = std::make_shared<const std::string>(std::move(req.body));
  std::optional<std::string> header_length;
  if (auto h = req.headers.find("inference-header-content-length"); h != req.headers.end())
    header_length = h->second;
  auto decoded = decode_rest_infer(body, header_length, core_.shm());
  if (!decoded.ok()) return send(reply_error(decoded.error()));
  InferRequest r = std::move(decoded).value();
  r.model = model;
  r.version = version;
  r.cancelled = std::move(req.gone);
  core_.infer(std::move(r), [this, send = std::move(send)](InferRequest& rq, Result<Outputs> out) {
    if (!out.ok()) return send(reply_error(out.error()));
    auto entry = core_.find(rq.model, rq.version);
    auto encoded = encode_rest_infer(rq, *(*entry)->model, *out, core_.shm());
    if (!encoded.ok()) return send(reply_error(encoded.error()));
    HttpReply reply{200, "application/json", std::move(encoded->body), {}};
    if (encoded->json_length) {
      reply.content_type = "application/octet-stream";
      reply.headers.emplace_back("Inference-Header-Content-Length",
                                 std::to_string(*encoded->json_length));
    }
    send(std::move(reply));
  });
}

namespace {

// Base64 (RFC 4648, padding optional); nullopt for a character outside the alphabet.
std::optional<std::string> base64_decode(const std::string& in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+' || c == '-')
      v = 62;
    else if (c == '/' || c == '_')
      v = 63;
    else if (c == '=')
      break;
    else
      return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

}  // namespace

// /v2/cudasharedmemory/region/NAME/register: {"raw_handle": {"b64": BASE64}, "device_id": D,
// "byte_size": N}, as Triton's clients send it.
HttpReply HttpApi::register_cuda(ShmRegistry& reg, const std::string& name, const json& body) {
  const bool shaped = body.is_object() && body.contains("raw_handle") &&
                      body["raw_handle"].is_object() && body["raw_handle"].contains("b64") &&
                      body["raw_handle"]["b64"].is_string() && body.contains("device_id") &&
                      body.contains("byte_size");
  if (!shaped)
    return reply_error({400,
                        "malformed register request: the body must be a JSON object with "
                        "\"raw_handle\": {\"b64\": ...}, \"device_id\" and \"byte_size\""});
  const json& dev = body["device_id"];
  const json& size = body["byte_size"];
  if (!dev.is_number_integer() || dev.get<int64_t>() < 0)
    return reply_error({400, fmt::format("device_id {} is not a device number", dump(dev))});
  if (!size.is_number_unsigned() && !(size.is_number_integer() && size.get<int64_t>() >= 0))
    return reply_error(
        {400, fmt::format("byte_size {} is not a whole number of bytes", dump(size))});
  auto handle = base64_decode(body["raw_handle"]["b64"].get<std::string>());
  if (!handle) return reply_error({400, "raw_handle's b64 is not base64"});
  if (Check c = reg.register_cuda_region(name, *handle, dev.get<int64_t>(), size.get<uint64_t>()))
    return reply_error(*c);
  return reply_json(200, "");
}

HttpReply HttpApi::shared_memory(const HttpRequest& req, const std::string& path) {
  // /v2/{systemsharedmemory,cudasharedmemory}[/region/NAME]/{status,register,unregister}
  std::vector<std::string> p;
  path_segments(path, &p);
  std::string name;
  bool ok = p.size() == 3 || (p.size() == 5 && p[2] == "region");
  if (p.size() == 5) name = p[3];
  const std::string action = ok ? p.back() : "";
  ok = ok && (action == "status" || action == "register" || action == "unregister");
  if (!ok)
    return reply_error(
        {404, fmt::format("no such shared memory endpoint: {}", path.substr(0, 200))});
  const std::string want = action == "status" ? "GET" : "POST";
  if (req.method != want)
    return reply_error({405, fmt::format("{} takes {}, not {}", path.substr(0, 200), want,
                                         req.method.substr(0, 10))});
  const bool cuda = p[1] == "cudasharedmemory";
  ShmRegistry& reg = core_.shm();
  if (action == "status") {
    auto st = reg.status(name, cuda);
    if (!st.ok()) return reply_error(st.error());
    json a = json::array();
    for (const RegionStatus& r : *st)
      a.push_back(
          cuda ? json{{"name", r.name}, {"device_id", r.device_id}, {"byte_size", r.byte_size}}
               : json{{"name", r.name},
                      {"key", r.key},
                      {"offset", r.offset},
                      {"byte_size", r.byte_size}});
    return reply_json(200, dump(a));
  }
  if (action == "unregister") {
    reg.unregister(name, cuda);
    return reply_json(200, "");
  }
  if (name.empty())
    return reply_error(
        {404, fmt::format("register takes a region name: /v2/{}/region/NAME/register", p[1])});
  json body;
  try {
    body = json::parse(req.body.empty() ? std::string("null") : req.body);
  } catch (const json::exception& e) {
    return reply_error({400, fmt::format("malformed register request: {}", e.what())});
  }
  auto whole = [](const json& v) {
    return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  };
  auto repr = [](const json& v) {
    return v.is_string() ? fmt::format("'{}'", v.get<std::string>()) : dump(v);
  };
  if (cuda) return register_cuda(reg, name, body);
  if (!body.is_object() || !body.contains("key") || !body.contains("byte_size"))
    return reply_error({400,
                        "malformed register request: the body must be a JSON object with "
                        "\"key\" and \"byte_size\" (and \"offset\")"});
  const json& size = body["byte_size"];
  const json offset = body.contains("offset") ? body["offset"] : json(0);
  if (!body["key"].is_string())
    return reply_error(
        {400, fmt::format("shared memory key {} is not a string", repr(body["key"]))});
  if (!whole(size))
    return reply_error(
        {400, fmt::format("byte_size {} is not a whole number of bytes", repr(size))});
  if (!whole(offset))
    return reply_error(
        {400, fmt::format("offset {} is not a whole number of bytes", repr(offset))});
  if (Check c = reg.register_region(name, body["key"].get<std::string>(), offset.get<uint64_t>(),
                                    size.get<uint64_t>()))
    return reply_error(*c);
  return reply_json(200, "");
}

}  // namespace kiln::serve
