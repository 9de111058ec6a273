// C = op(A) op(B) in float32 by OpenBLAS, as an XLA FFI handler (speed path
// `openblas_products`). OpenBLAS runs single-threaded; a large product is split
// into two halves, one run here and one scheduled on XLA's own intra-op pool, so
// that no second set of threads competes with XLA's.
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" void scipy_cblas_sgemm64_(int order, int transa, int transb, int64_t m, int64_t n, int64_t k, float alpha,
                                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                                     int64_t ldc);
extern "C" void scipy_openblas_set_num_threads64_(int threads);

namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
// Below this many multiply-adds a product is not split.
constexpr int64_t kSplitFrom = int64_t{1} << 22;

ffi::Error Product(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                   ffi::ResultBuffer<ffi::F32> c, bool transpose_a, bool transpose_b) {
  static const bool single_threaded = (scipy_openblas_set_num_threads64_(1), true);
  (void)single_threaded;
  const auto a_dims = a.dimensions(), b_dims = b.dimensions();
  const int64_t m = transpose_a ? a_dims[1] : a_dims[0], k = transpose_a ? a_dims[0] : a_dims[1];
  const int64_t n = transpose_b ? b_dims[0] : b_dims[1];
  const int64_t lda = a_dims[1], ldb = b_dims[1];
  const float* A = a.typed_data();
  const float* B = b.typed_data();
  float* C = c->typed_data();
  // Rows [r0, r1) and columns [c0, c1) of C.
  auto block = [=](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    scipy_cblas_sgemm64_(kRowMajor, transpose_a ? kTrans : kNoTrans, transpose_b ? kTrans : kNoTrans, r1 - r0,
                         c1 - c0, k, 1.0f, transpose_a ? A + r0 : A + r0 * lda, lda,
                         transpose_b ? B + c0 * ldb : B + c0, ldb, 0.0f, C + r0 * n + c0, n);
  };
  if (m * n * k < kSplitFrom) {
    block(0, m, 0, n);
    return ffi::Error::Success();
  }
  const bool by_rows = m >= n;
  const int64_t half = ((by_rows ? m : n) / 2 + 15) / 16 * 16;
  auto second = [=] { by_rows ? block(half, m, 0, n) : block(0, m, half, n); };
  struct Claim {
    std::atomic<bool> taken{false}, done{false};
  };
  auto claim = std::make_shared<Claim>();
  pool.Schedule([claim, second] {
    if (!claim->taken.exchange(true)) {
      second();
      claim->done.store(true, std::memory_order_release);
    }
  });
  by_rows ? block(0, half, 0, n) : block(0, m, 0, half);
  // Both pool threads may be inside products, waiting for each other's
  // halves: whichever finds the second half untaken runs it.
  if (!claim->taken.exchange(true)) {
    second();
  } else {
    while (!claim->done.load(std::memory_order_acquire)) std::this_thread::yield();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(OpenblasProduct, Product,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
