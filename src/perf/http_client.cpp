// kiln perf's HTTP/REST client on Boost.Beast: one keep-alive connection, requests with binary
// tensors (Triton's binary tensor extension, as kiln serve's rest.cpp reads them) or shared
// memory references, every operation bounded by the request timeout.
#include <fmt/format.h>

// Debian's Boost 1.74 asio uses std::exchange without including <utility>: it comes first.
#include <utility>
// Boost.Asio and Beast
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>
#include <optional>

#include "perf/client.h"

namespace kiln::perf {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;

struct Reply {
  int status = 0;
  std::string body;
  std::optional<size_t> header_length;  // Inference-Header-Content-Length
};

// The server's one-line error ({"error": ...}) of a failed answer, else its body's start.
std::string error_of(const Reply& r) {
  auto j = json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string())
    return fmt::format("HTTP {}: {}", r.status, j["error"].get<std::string>());
  return fmt::format("HTTP {}: {}", r.status, r.body.substr(0, 200));
}

// One keep-alive connection; every operation runs on this thread's own io_context, bounded by
// the timeout (Beast's tcp_stream cancels what is pending when it expires).
class Connection {
 public:
  Connection(const Endpoint& at, int timeout_ms) : at_(at), timeout_(timeout_ms) {}

  Status connect() {
    stream_.socket().close();
    asio::ip::tcp::resolver resolver(ioc_);
    beast::error_code ec;
    const auto found = resolver.resolve(at_.host, std::to_string(at_.port), ec);
    if (ec) return KILN_ERROR("cannot resolve '{}': {}", at_.host, ec.message());
    stream_.expires_after(timeout_);
    stream_.async_connect(found, [&](beast::error_code e, const auto&) { ec = e; });
    run();
    if (ec)
      return KILN_ERROR("cannot reach kiln serve at {} over HTTP: {} (is the server up?)",
                        at_.text(), ec.message());
    stream_.socket().set_option(asio::ip::tcp::no_delay(true), ec);
    connected_ = true;
    return Status::Ok();
  }

  Expected<Reply> send(const http::request<http::string_body>& req) {
    if (!connected_) KILN_RETURN_IF_ERROR(connect());
    beast::error_code ec;
    http::response_parser<http::string_body> parser;
    parser.body_limit(uint64_t{1} << 34);
    buffer_.clear();
    stream_.expires_after(timeout_);
    http::async_write(stream_, req, [&](beast::error_code e, size_t) {
      ec = e;
      if (!e)
        http::async_read(stream_, buffer_, parser, [&](beast::error_code r, size_t) { ec = r; });
    });
    run();
    if (ec) {
      connected_ = false;
      stream_.socket().close();
      return KILN_ERROR("HTTP {}: {}", ec == beast::error::timeout ? "timeout" : "error",
                        ec.message());
    }
    auto& res = parser.get();
    Reply r;
    r.status = static_cast<int>(res.result_int());
    if (auto h = res.find("Inference-Header-Content-Length"); h != res.end()) {
      const std::string v(h->value());
      char* stop = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &stop, 10);
      if (v.empty() || *stop != '\0')
        return KILN_ERROR("malformed answer: Inference-Header-Content-Length '{}'", v);
      r.header_length = n;
    }
    if (!res.keep_alive()) {
      connected_ = false;
      stream_.socket().close();
    }
    r.body = std::move(res.body());
    return r;
  }

  const Endpoint& endpoint() const { return at_; }

 private:
  void run() {
    ioc_.restart();
    ioc_.run();
  }
  Endpoint at_;
  std::chrono::milliseconds timeout_;
  asio::io_context ioc_;
  beast::tcp_stream stream_{ioc_};
  beast::flat_buffer buffer_;
  bool connected_ = false;
};

http::request<http::string_body> make_request(http::verb verb, const std::string& target,
                                              const Endpoint& at) {
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, at.text());
  req.keep_alive(true);
  return req;
}

class HttpClient : public Client {
 public:
  HttpClient(const Endpoint& at, int timeout_ms) : conn_(at, timeout_ms) {}
  Status connect() { return conn_.connect(); }

  Expected<ModelMeta> metadata(const std::string& model, const std::string& version) override {
    auto req = make_request(http::verb::get, model_path(model, version), conn_.endpoint());
    KILN_ASSIGN_OR_RETURN(Reply r, conn_.send(req));
    if (r.status != 200) return KILN_ERROR("model '{}': {}", model, error_of(r));
    auto j = json::parse(r.body, nullptr, false);
    ModelMeta meta;
    meta.name = model;
    auto tensors = [&](const char* key, std::vector<TensorMeta>& out) -> bool {
      if (!j.is_object() || !j.contains(key) || !j[key].is_array()) return false;
      for (const json& t : j[key]) {
        if (!t.is_object() || !t.value("name", json()).is_string() ||
            !t.value("datatype", json()).is_string() || !t.value("shape", json()).is_array())
          return false;
        TensorMeta m{t["name"].get<std::string>(), t["datatype"].get<std::string>(), {}};
        for (const json& d : t["shape"]) {
          if (!d.is_number_integer()) return false;
          m.shape.push_back(d.get<int64_t>());
        }
        out.push_back(std::move(m));
      }
      return true;
    };
    if (!tensors("inputs", meta.inputs) || !tensors("outputs", meta.outputs))
      return KILN_ERROR("model '{}': malformed metadata from {}: {}", model,
                        conn_.endpoint().text(), r.body.substr(0, 200));
    return meta;
  }

  Status register_shm(const std::string& name, const std::string& key, uint64_t size) override {
    auto req = make_request(http::verb::post,
                            fmt::format("/v2/systemsharedmemory/region/{}/register", name),
                            conn_.endpoint());
    req.set(http::field::content_type, "application/json");
    req.body() = json{{"key", key}, {"offset", 0}, {"byte_size", size}}.dump();
    req.prepare_payload();
    KILN_ASSIGN_OR_RETURN(Reply r, conn_.send(req));
    if (r.status != 200)
      return KILN_ERROR("registering shared memory region '{}': {}", name, error_of(r));
    return Status::Ok();
  }

  Status unregister_shm(const std::string& name) override {
    auto req = make_request(http::verb::post,
                            fmt::format("/v2/systemsharedmemory/region/{}/unregister", name),
                            conn_.endpoint());
    req.prepare_payload();
    KILN_ASSIGN_OR_RETURN(Reply r, conn_.send(req));
    if (r.status != 200)
      return KILN_ERROR("unregistering shared memory region '{}': {}", name, error_of(r));
    return Status::Ok();
  }

  Status prepare(const RequestPlan& plan, const ShmLayout* shm) override {
    json inputs = json::array(), outputs = json::array();
    std::string data;
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      const InputPlan& in = plan.inputs[i];
      json t = {
          {"name", in.tensor.name}, {"datatype", in.tensor.datatype}, {"shape", in.tensor.shape}};
      if (shm) {
        t["parameters"] = {{"shared_memory_region", shm->region},
                           {"shared_memory_offset", shm->input_offsets[i]},
                           {"shared_memory_byte_size", in.data.size()}};
      } else {
        t["parameters"] = {{"binary_data_size", in.data.size()}};
        data += in.data;
      }
      inputs.push_back(std::move(t));
    }
    for (size_t i = 0; i < plan.outputs.size(); ++i) {
      json o = {{"name", plan.outputs[i].name}};
      if (shm)
        o["parameters"] = {{"shared_memory_region", shm->region},
                           {"shared_memory_offset", shm->output_offsets[i]},
                           {"shared_memory_byte_size", plan.outputs[i].bytes}};
      else
        o["parameters"] = {{"binary_data", true}};
      outputs.push_back(std::move(o));
    }
    const std::string header = json{{"inputs", inputs}, {"outputs", outputs}}.dump();
    req_ = make_request(http::verb::post, model_path(plan.model, plan.version) + "/infer",
                        conn_.endpoint());
    req_.set("Inference-Header-Content-Length", std::to_string(header.size()));
    req_.set(http::field::content_type, "application/octet-stream");
    req_.body() = header + data;
    req_.prepare_payload();
    outputs_ = plan.outputs.size();
    return Status::Ok();
  }

  Status infer() override {
    KILN_ASSIGN_OR_RETURN(Reply r, conn_.send(req_));
    if (r.status != 200) return Status::Error(error_of(r));
    const size_t n = r.header_length.value_or(r.body.size());
    if (n > r.body.size())
      return KILN_ERROR(
          "malformed answer: Inference-Header-Content-Length {} is over its body "
          "of {} bytes",
          n, r.body.size());
    auto j = json::parse(r.body.begin(), r.body.begin() + static_cast<std::ptrdiff_t>(n), nullptr,
                         false);
    if (!j.is_object() || !j.contains("outputs") || !j["outputs"].is_array())
      return KILN_ERROR("malformed answer: {}", r.body.substr(0, std::min<size_t>(n, 200)));
    if (j["outputs"].size() != outputs_)
      return KILN_ERROR("the answer has {} outputs, not the {} asked for", j["outputs"].size(),
                        outputs_);
    size_t binary = 0;
    for (const json& o : j["outputs"])
      if (o.contains("parameters") && o["parameters"].is_object())
        binary += o["parameters"].value("binary_data_size", size_t{0});
    if (n + binary != r.body.size())
      return KILN_ERROR("the answer's binary outputs take {} bytes, {} follow its JSON", binary,
                        r.body.size() - n);
    return Status::Ok();
  }

 private:
  Connection conn_;
  http::request<http::string_body> req_;
  size_t outputs_ = 0;
};

std::string percent_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

}  // namespace

std::string model_path(const std::string& model, const std::string& version) {
  std::string p = "/v2/models/" + percent_encode(model);
  if (!version.empty()) p += "/versions/" + percent_encode(version);
  return p;
}

Expected<std::unique_ptr<Client>> connect_http(const Endpoint& at, int timeout_ms) {
  auto c = std::make_unique<HttpClient>(at, timeout_ms);
  KILN_RETURN_IF_ERROR(c->connect());
  return std::unique_ptr<Client>(std::move(c));
}

Expected<std::string> http_get(const Endpoint& at, const std::string& target, int timeout_ms) {
  Connection conn(at, timeout_ms);
  KILN_ASSIGN_OR_RETURN(Reply r, conn.send(make_request(http::verb::get, target, at)));
  if (r.status != 200) return KILN_ERROR("GET {} at {}: {}", target, at.text(), error_of(r));
  return std::move(r.body);
}

}  // namespace kiln::perf
