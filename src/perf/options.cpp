#include "perf/options.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace kiln::perf {
namespace {

constexpr int kMaxLevels = 1000;
constexpr double kMaxConcurrency = 1024;  // one thread and connection each
constexpr double kMaxRate = 1e6;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t at = s.find(sep, pos);
    out.push_back(s.substr(pos, at == std::string::npos ? std::string::npos : at - pos));
    if (at == std::string::npos) return out;
    pos = at + 1;
  }
}

bool parse_number(const std::string& s, double* out) {
  if (s.empty() || s.size() > 30) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(s.c_str(), &end);
  return *end == '\0' && errno == 0 && std::isfinite(*out);
}

bool parse_int(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty() || s.size() > 18) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtoll(s.c_str(), &end, 10);
  return *end == '\0' && errno == 0 && *out >= lo && *out <= hi;
}

}  // namespace

std::string Endpoint::text() const {
  const bool v6 = host.find(':') != std::string::npos;
  return fmt::format("{}{}{}:{}", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

Expected<std::vector<double>> parse_range(const std::string& text, const std::string& flag,
                                          bool integral) {
  const char* what = integral ? "concurrencies" : "request rates";
  const auto bad = [&](const std::string& why) {
    return KILN_ERROR("{} takes start[:end[:step]] ({}, e.g. 1:8:1 or 1:64:x2), not '{}': {}", flag,
                      what, text, why);
  };
  const std::vector<std::string> parts = split(text, ':');
  if (parts.size() > 3) return bad("more than three parts");
  double start = 0, end = 0, step = 1;
  bool multiply = false;
  if (!parse_number(parts[0], &start)) return bad(fmt::format("'{}' is not a number", parts[0]));
  end = start;
  if (parts.size() > 1 && !parse_number(parts[1], &end))
    return bad(fmt::format("'{}' is not a number", parts[1]));
  if (parts.size() > 2) {
    std::string s = parts[2];
    multiply = !s.empty() && (s[0] == 'x' || s[0] == '*');
    if (multiply) s.erase(0, 1);
    if (!parse_number(s, &step)) return bad(fmt::format("step '{}' is not a number", parts[2]));
    if (multiply ? step <= 1 : step <= 0)
      return bad(multiply ? "a multiplying step must be over 1" : "the step must be positive");
  }
  const double hi = integral ? kMaxConcurrency : kMaxRate;
  for (double v : {start, end, step}) {
    if (integral && v != std::floor(v) && !(multiply && v == step))
      return bad(fmt::format("{} is not a whole number", v));
  }
  if (start <= 0 || (integral && start < 1)) return bad("the start must be positive");
  if (end < start) return bad("the end is below the start");
  if (end > hi) return bad(fmt::format("the end is over {}", hi));
  std::vector<double> out;
  for (double v = start; v <= end * (1 + 1e-12);) {
    out.push_back(v);
    if (static_cast<int>(out.size()) > kMaxLevels)
      return bad(fmt::format("over {} levels", kMaxLevels));
    double next = multiply ? v * step : v + step;
    if (integral) next = std::floor(next);
    if (next <= v) next = v + 1;
    v = next;
  }
  return out;
}

Expected<Endpoint> parse_endpoint(const std::string& text, int default_port,
                                  const std::string& flag) {
  std::string s = text;
  for (const char* scheme : {"http://", "grpc://"})
    if (s.rfind(scheme, 0) == 0) s.erase(0, std::string(scheme).size());
  if (s.find("://") != std::string::npos)
    return KILN_ERROR("{} '{}': kiln perf speaks plain http:// and grpc:// (no TLS)", flag, text);
  s = s.substr(0, s.find('/'));
  Endpoint e;
  e.port = default_port;
  std::string port;
  if (!s.empty() && s[0] == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos)
      return KILN_ERROR("{} '{}': no ']' after the address", flag, text);
    e.host = s.substr(1, close - 1);
    const std::string rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return KILN_ERROR("{} '{}': expected ':PORT' after ']'", flag, text);
      port = rest.substr(1);
      if (port.empty()) return KILN_ERROR("{} '{}': the port is missing", flag, text);
    }
  } else {
    const size_t colon = s.rfind(':');
    if (colon != std::string::npos && s.find(':') != colon)
      return KILN_ERROR("{} '{}': write an IPv6 address in brackets ([::1]:8080)", flag, text);
    e.host = s.substr(0, colon);
    if (colon != std::string::npos) {
      port = s.substr(colon + 1);
      if (port.empty()) return KILN_ERROR("{} '{}': the port is missing", flag, text);
    }
  }
  if (e.host.empty()) return KILN_ERROR("{} '{}': no host", flag, text);
  for (char c : e.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' ||
          c == '_'))
      return KILN_ERROR("{} '{}': '{}' is not a host name or address", flag, text, e.host);
  if (!port.empty()) {
    long long p = 0;
    if (!parse_int(port, 1, 65535, &p))
      return KILN_ERROR("{} '{}': port '{}' is not a number from 1 to 65535", flag, text, port);
    e.port = static_cast<int>(p);
  }
  return e;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "ip6-localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1")
    return true;
  const std::vector<std::string> parts = split(host, '.');
  if (parts.size() != 4 || parts[0] != "127") return false;
  for (const std::string& p : parts) {
    long long v = 0;
    if (p.size() > 3 || !parse_int(p, 0, 255, &v)) return false;
  }
  return true;
}

Expected<std::map<std::string, std::vector<int64_t>>> parse_shape_specs(
    const std::vector<std::string>& specs) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const std::string& spec : specs) {
    const size_t colon = spec.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return KILN_ERROR("--shape takes NAME:D1,D2,... (e.g. input_ids:128), not '{}'", spec);
    const std::string name = spec.substr(0, colon);
    std::vector<int64_t> dims;
    const std::string list = spec.substr(colon + 1);
    if (!list.empty()) {
      for (const std::string& d : split(list, ',')) {
        long long v = 0;
        if (!parse_int(d, 1, int64_t{1} << 40, &v))
          return KILN_ERROR("--shape '{}': '{}' is not a dimension (a whole number >= 1)", spec, d);
        dims.push_back(v);
      }
    }
    if (!out.emplace(name, std::move(dims)).second)
      return KILN_ERROR("--shape: input '{}' is given twice", name);
  }
  return out;
}

}  // namespace kiln::perf
