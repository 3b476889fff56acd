// cuBLAS and cuBLASLt, opened at their first call rather than when kiln is loaded.
//
// cuBLASLt's static initialisers touch about 200 MB (some 27,000 page faults, ~150 ms) in every
// process that links it, whether or not it runs a GEMM: every `kiln` command, `import kiln` and
// CPU-backend run paid for them. kiln does not link either library; this file defines the
// functions kiln calls, each of which opens the library (dlopen, libkiln's RUNPATH) and forwards
// to it. Compiled with hidden visibility (CMakeLists.txt): a program that links cuBLAS itself
// next to libkiln calls its own copy. A library that cannot be opened makes each call return
// CUBLAS_STATUS_NOT_INITIALIZED, and the status strings say which library and why.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#include "cublas_open.h"

namespace kiln::gpu {
namespace {

struct Opened {
  void* handle = nullptr;
  std::string why;  // empty when opened
};

Opened open_library(const char* base, int major) {
  Opened o;
  const std::string name = std::string(base) + ".so." + std::to_string(major);
  o.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!o.handle) {
    const char* e = dlerror();
    o.why = "cannot open " + name + (e ? std::string(": ") + e : std::string());
  }
  return o;
}

const Opened& lt() {
  static const Opened o = open_library("libcublasLt", CUBLAS_VER_MAJOR);
  return o;
}
const Opened& blas() {
  static const Opened o = open_library("libcublas", CUBLAS_VER_MAJOR);
  return o;
}

void* find(const Opened& lib, const char* name) {
  return lib.handle ? dlsym(lib.handle, name) : nullptr;
}

}  // namespace

std::string cublas_open_error() {
  if (!lt().why.empty()) return lt().why;
  return blas().why;
}

}  // namespace kiln::gpu

using kiln::gpu::blas;
using kiln::gpu::find;
using kiln::gpu::lt;

#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)  // the symbol's name after cublas_v2.h's macros (cublasCreate_v2)
// The function NAME of LIB, forwarded: R its result, PARAMS as the header declares them, ARGS
// their names, OR what it returns when the library could not be opened.
#define KILN_FORWARD_OR(LIB, R, NAME, PARAMS, ARGS, OR)                                 \
  extern "C" R NAME PARAMS {                                                            \
    using Fn = R(*) PARAMS; /* not decltype: some have C++ overloads */                 \
    static const auto f = reinterpret_cast<Fn>(find(LIB(), KILN_STR(NAME)));            \
    return f ? f ARGS : OR;                                                             \
  }
#define KILN_FORWARD(LIB, NAME, PARAMS, ARGS) \
  KILN_FORWARD_OR(LIB, cublasStatus_t, NAME, PARAMS, ARGS, CUBLAS_STATUS_NOT_INITIALIZED)

// cuBLASLt.
KILN_FORWARD(lt, cublasLtCreate, (cublasLtHandle_t * h), (h))
KILN_FORWARD(lt, cublasLtDestroy, (cublasLtHandle_t h), (h))
KILN_FORWARD(lt, cublasLtMatmulDescCreate,
             (cublasLtMatmulDesc_t * d, cublasComputeType_t compute, cudaDataType_t scale),
             (d, compute, scale))
KILN_FORWARD(lt, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))
KILN_FORWARD(lt, cublasLtMatmulDescSetAttribute,
             (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* buf,
              size_t size),
             (d, attr, buf, size))
KILN_FORWARD(lt, cublasLtMatrixLayoutCreate,
             (cublasLtMatrixLayout_t * l, cudaDataType type, uint64_t rows, uint64_t cols,
              int64_t ld),
             (l, type, rows, cols, ld))
KILN_FORWARD(lt, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))
KILN_FORWARD(lt, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p), (p))
KILN_FORWARD(lt, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))
KILN_FORWARD(lt, cublasLtMatmulPreferenceSetAttribute,
             (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
              const void* buf, size_t size),
             (p, attr, buf, size))
KILN_FORWARD(lt, cublasLtMatmulAlgoGetHeuristic,
             (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
              cublasLtMatmulPreference_t pref, int requested,
              cublasLtMatmulHeuristicResult_t results[], int* returned),
             (h, op, a, b, c, d, pref, requested, results, returned))
KILN_FORWARD(lt, cublasLtMatmulAlgoConfigGetAttribute,
             (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr,
              void* buf, size_t size, size_t* written),
             (algo, attr, buf, size, written))
KILN_FORWARD(lt, cublasLtMatmul,
             (cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha, const void* a,
              cublasLtMatrixLayout_t ad, const void* b, cublasLtMatrixLayout_t bd,
              const void* beta, const void* c, cublasLtMatrixLayout_t cd, void* d,
              cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t* algo, void* ws,
              size_t ws_size, cudaStream_t stream),
             (h, op, alpha, a, ad, b, bd, beta, c, cd, d, dd, algo, ws, ws_size, stream))

// cuBLAS.
KILN_FORWARD(blas, cublasCreate, (cublasHandle_t * h), (h))
KILN_FORWARD(blas, cublasDestroy, (cublasHandle_t h), (h))
KILN_FORWARD(blas, cublasSetStream, (cublasHandle_t h, cudaStream_t s), (h, s))
KILN_FORWARD(blas, cublasGetStream, (cublasHandle_t h, cudaStream_t * s), (h, s))
KILN_FORWARD(blas, cublasSetWorkspace, (cublasHandle_t h, void* ws, size_t size), (h, ws, size))
KILN_FORWARD(blas, cublasSetMathMode, (cublasHandle_t h, cublasMath_t mode), (h, mode))
KILN_FORWARD(blas, cublasGemmEx,
             (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
              const void* alpha, const void* a, cudaDataType at, int lda, const void* b,
              cudaDataType bt, int ldb, const void* beta, void* c, cudaDataType ct, int ldc,
              cublasComputeType_t compute, cublasGemmAlgo_t algo),
             (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo))
KILN_FORWARD(blas, cublasGemmStridedBatchedEx,
             (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
              const void* alpha, const void* a, cudaDataType at, int lda, long long int sa,
              const void* b, cudaDataType bt, int ldb, long long int sb, const void* beta,
              void* c, cudaDataType ct, int ldc, long long int sc, int batch,
              cublasComputeType_t compute, cublasGemmAlgo_t algo),
             (h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb, beta, c, ct, ldc, sc,
              batch, compute, algo))

// What does not return a status.
KILN_FORWARD_OR(lt, size_t, cublasLtGetVersion, (void), (), 0)
KILN_FORWARD_OR(lt, const char*, cublasLtGetStatusString, (cublasStatus_t s), (s), lt().why.c_str())
KILN_FORWARD_OR(blas, const char*, cublasGetStatusString, (cublasStatus_t s), (s), blas().why.c_str())
KILN_FORWARD_OR(blas, const char*, cublasGetStatusName, (cublasStatus_t s), (s),
                "CUBLAS_STATUS_NOT_INITIALIZED")
