// Generated kernels: the store, NVRTC and the cubins' loading (rtc.h).
#include "rtc.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvrtc.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

namespace kiln::gpu::rtc {
namespace {

// --- NVRTC, opened at first use ----------------------------------------------------------------
struct Nvrtc {
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&nvrtcGetCUBIN) cubin = nullptr;
  decltype(&nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&nvrtcGetProgramLog) log = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  decltype(&nvrtcGetErrorString) error = nullptr;
  std::string why;  // empty when loaded
};

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc r;
    void* h = nullptr;
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"})
      if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) {
      r.why = "NVRTC (libnvrtc.so.13) was not found: generated kernels cannot be compiled here";
      return r;
    }
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, name));
      if (!f && r.why.empty()) r.why = fmt::format("NVRTC lacks {}", name);
    };
    sym(r.create, "nvrtcCreateProgram");
    sym(r.compile, "nvrtcCompileProgram");
    sym(r.cubin_size, "nvrtcGetCUBINSize");
    sym(r.cubin, "nvrtcGetCUBIN");
    sym(r.log_size, "nvrtcGetProgramLogSize");
    sym(r.log, "nvrtcGetProgramLog");
    sym(r.destroy, "nvrtcDestroyProgram");
    sym(r.error, "nvrtcGetErrorString");
    return r;
  }();
  return n;
}

std::atomic<uint64_t> g_compiled{0}, g_compile_us{0};

// The cubin of `source` for compute capability `sm` (90: sm_90).
Expected<std::string> compile(const std::string& source, const std::string& key, int sm) {
  struct Count {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Count() {
      g_compiled += 1;
      g_compile_us += std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - t0).count();
    }
  } count;
  const Nvrtc& n = nvrtc();
  if (!n.why.empty()) return KILN_ERROR("{}: {}", key, n.why);
  const std::string arch = fmt::format("--gpu-architecture=sm_{}", sm);
  const char* opts[] = {arch.c_str(), "-std=c++17", "--extra-device-vectorization"};
  nvrtcProgram prog = nullptr;
  nvrtcResult r = n.create(&prog, source.c_str(), "kiln_generated.cu", 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS) return KILN_ERROR("{}: NVRTC: {}", key, n.error(r));
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(
      &prog, [](nvrtcProgram* p) { nvrtc().destroy(p); });
  r = n.compile(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t size = 0;
    n.log_size(prog, &size);
    std::string log(size, '\0');
    n.log(prog, log.data());
    const size_t nl = log.find('\n');
    return KILN_ERROR("{}: NVRTC could not compile the generated kernel: {}", key,
                      log.substr(0, nl == std::string::npos ? log.size() : nl));
  }
  size_t size = 0;
  if (n.cubin_size(prog, &size) != NVRTC_SUCCESS || size == 0)
    return KILN_ERROR("{}: NVRTC produced no cubin", key);
  std::string cubin(size, '\0');
  if (n.cubin(prog, cubin.data()) != NVRTC_SUCCESS)
    return KILN_ERROR("{}: NVRTC produced no cubin", key);
  return cubin;
}

// --- base64 (RFC 4648), for cubins in JSON ------------------------------------------------------
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string to_base64(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v =
        uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kB64[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool from_base64(const std::string& in, std::string* out) {
  if (in.size() % 4 != 0) return false;
  out->clear();
  out->reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      int d = -1;
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        d = 0;
        ++pad;
      } else if (pad == 0) {
        const char* p = c ? std::char_traits<char>::find(kB64, 64, c) : nullptr;
        d = p ? static_cast<int>(p - kB64) : -1;
      }
      if (d < 0) return false;
      v = v << 6 | uint32_t(d);
    }
    out->push_back(char(v >> 16));
    if (pad < 2) out->push_back(char(v >> 8 & 255));
    if (pad < 1) out->push_back(char(v & 255));
  }
  return true;
}

// --- the store ----------------------------------------------------------------------------------
struct Module {
  std::string source;  // empty for a cubin imported without its source
  std::string cubin;   // empty until compiled or imported
  cudaLibrary_t library = nullptr;
  std::map<std::string, cudaKernel_t> kernels;
};

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, Module>& store() {
  static auto* s = new std::map<std::string, Module>();  // lives as long as loaded kernels
  return *s;
}

// The cubin of `m`, compiled now where it has none. Called with mu() held.
Status ensure_cubin(const std::string& key, Module& m) {
  if (!m.cubin.empty()) return Status::Ok();
  if (m.source.empty()) return KILN_ERROR("{}: no cubin and no source for this kernel", key);
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return KILN_ERROR("{}: no CUDA device to compile for", key);
  KILN_ASSIGN_OR_RETURN(m.cubin, compile(m.source, key, major * 10 + minor));
  return Status::Ok();
}

}  // namespace

CompileStats compile_stats() { return {g_compiled.load(), g_compile_us.load() * 1e-6}; }

std::string add_source(const std::string& source) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : source) h = (h ^ c) * 1099511628211ull;
  const std::string key = fmt::format("{}{:016x}", kKeyPrefix, h);
  std::lock_guard<std::mutex> lock(mu());
  Module& m = store()[key];
  if (m.source.empty()) {
    m.source = source;
    if (const char* dir = std::getenv("KILN_RTC_DUMP"); dir && *dir) {  // to read or profile
      std::ofstream f(std::filesystem::path(dir) / (key.substr(4) + ".cu"));
      f << source;
    }
  }
  return key;
}

Expected<cudaKernel_t> kernel(const std::string& key, const char* name) {
  std::lock_guard<std::mutex> lock(mu());
  auto it = store().find(key);
  if (it == store().end())
    return KILN_ERROR("{}: generated kernel not in this engine (engine from another kiln?)", key);
  Module& m = it->second;
  if (auto k = m.kernels.find(name); k != m.kernels.end()) return k->second;
  KILN_RETURN_IF_ERROR(ensure_cubin(key, m));
  if (!m.library) {
    const cudaError_t e =
        cudaLibraryLoadData(&m.library, m.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (e != cudaSuccess) {
      m.library = nullptr;
      return KILN_ERROR(
          "{}: the generated kernel's cubin does not load ({}): built for another GPU?", key,
          cudaGetErrorString(e));
    }
  }
  cudaKernel_t k = nullptr;
  if (cudaLibraryGetKernel(&k, m.library, name) != cudaSuccess)
    return KILN_ERROR("{}: the generated module has no kernel '{}'", key, name);
  m.kernels[name] = k;
  return k;
}

Expected<nlohmann::json> export_cubins(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu());
  nlohmann::json j = nlohmann::json::object();
  for (const std::string& key : keys) {
    if (key.rfind(kKeyPrefix, 0) != 0 || j.contains(key)) continue;
    auto it = store().find(key);
    if (it == store().end()) return KILN_ERROR("{}: generated kernel unknown", key);
    KILN_RETURN_IF_ERROR(ensure_cubin(key, it->second));
    j[key] = to_base64(it->second.cubin);
  }
  return j;
}

nlohmann::json export_all() {
  std::lock_guard<std::mutex> lock(mu());
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, m] : store())
    if (!m.cubin.empty()) j[key] = to_base64(m.cubin);
  return j;
}

Status import_cubins(const nlohmann::json& j) {
  if (!j.is_object()) return KILN_ERROR("generated kernels: not an object of key: base64 cubin");
  std::lock_guard<std::mutex> lock(mu());
  for (const auto& [key, v] : j.items()) {
    std::string cubin;
    if (key.rfind(kKeyPrefix, 0) != 0 || !v.is_string() ||
        !from_base64(v.get<std::string>(), &cubin) || cubin.empty())
      return KILN_ERROR("generated kernel '{}': not a base64 cubin", key);
    Module& m = store()[key];
    if (m.cubin.empty()) m.cubin = std::move(cubin);
  }
  return Status::Ok();
}

Expected<size_t> compile_check(const std::string& key, int sm) {
  std::string source;
  {
    std::lock_guard<std::mutex> lock(mu());
    auto it = store().find(key);
    if (it == store().end() || it->second.source.empty())
      return KILN_ERROR("{}: no source for this kernel", key);
    source = it->second.source;
  }
  KILN_ASSIGN_OR_RETURN(std::string cubin, compile(source, key, sm));
  return cubin.size();
}

bool compiler_available(std::string* why) {
  const Nvrtc& n = nvrtc();
  if (why) *why = n.why;
  return n.why.empty();
}

}  // namespace kiln::gpu::rtc
