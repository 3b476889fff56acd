#include "serve/http_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>

#include "serve/http_api.h"

namespace kiln::serve {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr auto kIdle = std::chrono::seconds(120);  // a keep-alive connection with no request
constexpr auto kIo = std::chrono::seconds(60);     // one request's reading or its answer's writing
constexpr size_t kReadChunk = 128 * 1024;          // a connection's read buffer

struct Shared {
  HttpApi api;
  Core& core;
  bool log;
  std::atomic<int> in_flight{0};  // requests read and not yet answered
  std::atomic<int> posting{0};    // answers being posted from a batcher's thread
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Shared& s) : stream_(std::move(socket)), s_(s) {
    // Beast reads as much as the buffer has room for, at least 512 bytes: without room a 602 KB
    // body took 1,180 reads of about 500 bytes (and as many timer updates).
    buffer_.reserve(kReadChunk);
  }
  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(64 * 1024);
    // No limit while the header is read (Beast would refuse a long Content-Length there, before
    // the 413 could be answered); the length is checked in on_header, a chunked body as it comes.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(kIdle);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return close();
    const auto length = parser_->content_length();
    if (length && *length > s_.api.limit()) return refuse(s_.api.too_large(*length));
    parser_->body_limit(s_.api.limit());
    stream_.expires_after(kIo);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) return refuse(s_.api.too_large(0));
    if (ec) return close();
    auto& m = parser_->get();
    HttpRequest req;
    req.method = std::string(m.method_string());
    req.target = std::string(m.target());
    for (const auto& f : m) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      req.headers[name] = std::string(f.value());
    }
    keep_alive_ = m.keep_alive();
    version_ = m.version();
    req.body = std::move(m.body());
    if (s_.log) std::fprintf(stderr, "kiln serve: %s %s\n", req.method.c_str(), req.target.c_str());
    s_.in_flight++;
    stream_.expires_never();  // an inference may wait in the queue
    auto gone = std::make_shared<std::atomic<bool>>(false);
    req.gone = [gone] { return gone->load(std::memory_order_relaxed); };
    answered_ = false;
    watch(gone);
    // Answered now or from a batcher's worker: either way on this connection's strand. The
    // session moves (no copy stays behind) into the posted answer, and the executor's copy (a
    // strand of the io_context) is dropped before `posting` falls: stop() waits for both, since
    // the answer may be written and the server stopped before the posting thread returns, and a
    // strand or session released after the io_context is gone touches a destroyed service.
    s_.api.handle(std::move(req), [session = shared_from_this()](HttpReply reply) mutable {
      if (!session) return;  // answered already
      Shared& s = session->s_;
      s.posting++;
      {
        auto strand = session->stream_.get_executor();
        net::post(strand, [self = std::move(session), reply = std::move(reply)]() mutable {
          self->answered_ = true;
          beast::error_code ignored;
          self->stream_.socket().cancel(ignored);  // the watch below
          self->write(std::move(reply), false);
        });
      }
      s.posting--;
    });
  }

  // While a request waits for its answer: a connection the client closed (the socket turns
  // readable and holds no byte) marks it gone, so the batcher drops it instead of running it.
  // Bytes of a next request (pipelining) are left for read() after the answer.
  void watch(std::shared_ptr<std::atomic<bool>> gone) {
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this(), gone](beast::error_code ec) {
          if (ec || self->answered_) return;
          char byte;
          const ssize_t n =
              ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) gone->store(true);
        });
  }

  // Answers a body over the limit, then reads and drops the rest of it (a lingering close), so
  // the client, still sending, reads the 413 and not a reset connection.
  void refuse(HttpReply reply) {
    keep_alive_ = false;
    version_ = parser_->get().version();
    s_.in_flight++;
    write(std::move(reply), true);
  }

  void write(HttpReply reply, bool linger) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(reply.status), version_ ? version_ : 11);
    res->set(http::field::server, "kiln");
    res->set(http::field::content_type, reply.content_type);
    for (auto& [k, v] : reply.headers) res->set(k, v);
    res->body() = std::move(reply.body);
    res->keep_alive(keep_alive_);
    res->prepare_payload();
    s_.core.count_response("http", reply.status);
    stream_.expires_after(kIo);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res, linger](beast::error_code ec, size_t) {
                        self->s_.in_flight--;
                        if (linger && !ec) return self->drain();
                        if (ec || !self->keep_alive_) return self->close();
                        self->read();
                      });
  }

  void drain() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(30));
    scratch_.resize(64 * 1024);
    stream_.async_read_some(net::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain_more();
                            });
  }
  void drain_more() {
    stream_.async_read_some(net::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain_more();
                            });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{1 << 20};  // up to 1 MiB of a body read at a time
  std::optional<http::request_parser<http::string_body>> parser_;
  std::vector<char> scratch_;
  bool keep_alive_ = true;
  bool answered_ = true;  // the request read last has been answered (watch() stops)
  unsigned version_ = 11;
  Shared& s_;
};

}  // namespace

struct HttpServer::Impl {
  HttpOptions opts;
  Shared shared;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  Impl(Core& core, HttpOptions o)
      : opts(std::move(o)),
        shared{HttpApi(core, opts.max_request_bytes), core, opts.log_requests} {}

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor.is_open()) return;
      if (!ec) {
        socket.set_option(tcp::no_delay(true), ec);
        std::make_shared<Session>(std::move(socket), shared)->start();
      }
      accept();
    });
  }
};

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
    problem =
        fmt::format("cannot listen on {}:{} ({}): {}", host, port, what, std::strerror(errno));
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return problem;
}

HttpServer::HttpServer(Core& core, HttpOptions options)
    : impl_(std::make_unique<Impl>(core, std::move(options))) {}

HttpServer::~HttpServer() = default;

Status HttpServer::bind() {
  Impl& s = *impl_;
  beast::error_code ec;
  tcp::resolver resolver(s.ioc);
  auto found =
      resolver.resolve(s.opts.host, std::to_string(s.opts.port), tcp::resolver::passive, ec);
  if (ec || found.empty())
    return KILN_ERROR("cannot listen on {}:{} (REST): {}", s.opts.host, s.opts.port, ec.message());
  const tcp::endpoint at = found.begin()->endpoint();
  s.acceptor.open(at.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(at, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return KILN_ERROR("cannot listen on {}:{} (REST): {}", s.opts.host, s.opts.port, ec.message());
  s.opts.port = s.acceptor.local_endpoint().port();
  return Status::Ok();
}

int HttpServer::port() const { return impl_->opts.port; }

void HttpServer::serve() {
  Impl& s = *impl_;
  int n = s.opts.threads;
  if (n <= 0) n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 2, 8);
  auto guard = net::make_work_guard(s.ioc);  // run() returns at stop(), not when idle
  s.accept();
  for (int i = 1; i < n; ++i) s.threads.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (std::thread& t : s.threads) t.join();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  net::post(s.ioc, [&s] {
    beast::error_code ignored;
    s.acceptor.close(ignored);
  });
  // Requests read and not yet answered are answered first (their batches run: Core::drain).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((s.shared.in_flight > 0 || s.shared.posting > 0) &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s.ioc.stop();
}

}  // namespace kiln::serve
