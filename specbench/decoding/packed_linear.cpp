// specbench::packed_linear(x, w, n, bias): y = x W^T (+ bias) for float32 on x86-64 CPUs with AVX2 and
// FMA, written for the few rows a speculative verification step has (1 to 16).
//
// Why a kernel of our own: a verification step multiplies a few rows by every weight of the model, so
// it should cost one read of the weights for any width up to the point where the arithmetic catches
// up. The library kernels at hand (inductor's C++ GEMM template, oneDNN, MKL) either fetch a block of
// weights and then compute on it, so a 16-row step costs the read *plus* the arithmetic, or stream
// poorly at 1-2 rows. Here each weight is read once per step, from a sequential stream prefetched ahead,
// and used for every row at once, so the read and the arithmetic overlap.
//
// Layout: W [n, K] is packed as panels of 6 output columns, w[p][k][j] = W[6p + j][k] (zero-padded),
// so a step reads the weights front to back. Up to 4 rows, a vector holds one k of a panel and each
// row's x is broadcast (tile_few); from 5 to 16 rows, the rows are held in vector lanes (x transposed:
// 8 lanes for up to 8 rows, 16 for up to 16) and each weight is broadcast once and multiplied into all
// lanes (tile8, tile16). Blocks of 16 rows repeat this (a prefill), rereading the weights.
//
// Every output is one fused multiply-add chain over k = 0..K-1 in order, whatever the number of rows
// and whichever tile computed it: a row's result does not depend on the rows beside it (batch
// invariance), so a verification row gives bit for bit what a one-row step gives.
#ifdef SPECBENCH_BREAK_BUILD  // the fallback test's way to make this build fail (tests/test_forward_choice.py)
#error SPECBENCH_BREAK_BUILD is set: a build failure made on purpose
#endif
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int64_t kPanel = 6;            // output columns per panel
constexpr int64_t kPrefetchBytes = 2048;  // how far ahead of the reads each stream is fetched
constexpr int64_t kFewRows = 4;           // up to this many rows: weights in the lanes (tile_few)

// 8 rows in one vector; `NP` adjacent panels (6 * NP columns), each its own stream
template <int NP>
inline void tile8(const float* xt, const float* w, int64_t K, float* acc) {
  __m256 c[NP][kPanel];
  for (int q = 0; q < NP; ++q)
    for (int j = 0; j < kPanel; ++j) c[q][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 xv = _mm256_load_ps(xt + 8 * k);
    for (int q = 0; q < NP; ++q) {
      const float* wk = w + q * kPanel * K + kPanel * k;
      if ((k & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(wk) + kPrefetchBytes, _MM_HINT_T0);
      for (int j = 0; j < kPanel; ++j) c[q][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(wk + j), xv, c[q][j]);
    }
  }
  for (int q = 0; q < NP; ++q)
    for (int j = 0; j < kPanel; ++j) _mm256_store_ps(acc + 8 * (kPanel * q + j), c[q][j]);
}

// 16 rows in two vectors, one panel: 12 accumulators, the most AVX2's 16 registers leave room for
inline void tile16(const float* xt, const float* w, int64_t K, float* acc) {
  __m256 c[kPanel][2];
  for (int j = 0; j < kPanel; ++j) c[j][0] = c[j][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 x0 = _mm256_load_ps(xt + 16 * k), x1 = _mm256_load_ps(xt + 16 * k + 8);
    const float* wk = w + kPanel * k;
    _mm_prefetch(reinterpret_cast<const char*>(wk) + kPrefetchBytes, _MM_HINT_T0);
    for (int j = 0; j < kPanel; ++j) {
      const __m256 b = _mm256_broadcast_ss(wk + j);
      c[j][0] = _mm256_fmadd_ps(b, x0, c[j][0]);
      c[j][1] = _mm256_fmadd_ps(b, x1, c[j][1]);
    }
  }
  for (int j = 0; j < kPanel; ++j) {
    _mm256_store_ps(acc + 16 * j, c[j][0]);
    _mm256_store_ps(acc + 16 * j + 8, c[j][1]);
  }
}

// Up to 4 rows: the weights in the lanes instead (a vector holds one k of a panel: its 6 columns and 2
// lanes of the next k, ignored), each row's x broadcast. One FMA then does 6 weights' work for a row
// instead of 1, so one or two rows are not held back by the arithmetic. fma(x, w, acc) here and
// fma(w, x, acc) above round the same exact product: the results are bit for bit those of tile8.
template <int NP, int MR>
inline void tile_few(const float* a, const float* w, int64_t K, float* acc) {
  __m256 c[NP][MR];
  for (int q = 0; q < NP; ++q)
    for (int m = 0; m < MR; ++m) c[q][m] = _mm256_setzero_ps();
  const __m256i first6 = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
  for (int64_t k = 0; k < K; ++k) {
    __m256 xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = _mm256_broadcast_ss(a + m * K + k);
    for (int q = 0; q < NP; ++q) {
      const float* wk = w + q * kPanel * K + kPanel * k;
      if ((k & 1) == 0)  // a panel advances 24 bytes per k: one prefetch per two k reaches every line
        _mm_prefetch(reinterpret_cast<const char*>(wk) + kPrefetchBytes, _MM_HINT_T0);
      // the last k of the last panel must not read past the weights
      const __m256 wv = k + 1 < K ? _mm256_loadu_ps(wk) : _mm256_maskload_ps(wk, first6);
      for (int m = 0; m < MR; ++m) c[q][m] = _mm256_fmadd_ps(xv[m], wv, c[q][m]);
    }
  }
  // acc[j * 8 + m]: column j of the tile, row m (the 8-lane layout of tile8)
  alignas(32) float t[8];
  for (int q = 0; q < NP; ++q)
    for (int m = 0; m < MR; ++m) {
      _mm256_store_ps(t, c[q][m]);
      for (int j = 0; j < kPanel; ++j) acc[(kPanel * q + j) * 8 + m] = t[j];
    }
}

template <int NP>
inline void tile_few_rows(int64_t rows, const float* a, const float* w, int64_t K, float* acc) {
  switch (rows) {
    case 1: tile_few<NP, 1>(a, w, K, acc); break;
    case 2: tile_few<NP, 2>(a, w, K, acc); break;
    case 3: tile_few<NP, 3>(a, w, K, acc); break;
    default: tile_few<NP, 4>(a, w, K, acc); break;
  }
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, int64_t n, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "packed_linear: float32 only");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == kPanel && w.is_contiguous(), "packed_linear: w must be packed [P, K, 6]");
  const int64_t P = w.size(0), K = w.size(1);
  TORCH_CHECK(x.size(-1) == K, "packed_linear: x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(n <= P * kPanel, "packed_linear: n larger than the packed weight");
  const at::Tensor xs = x.contiguous();
  const int64_t M = K ? xs.numel() / K : 0;
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  at::Tensor out = at::empty(sizes, x.options());
  const float* a = xs.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const at::Tensor b = (bias.has_value() && bias->defined()) ? bias->contiguous() : at::Tensor();
  const float* bi = b.defined() ? b.data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  at::Tensor xt_buf = at::empty({K * 16 + 8}, x.options());
  // 32-byte aligned start for the vector loads
  float* xt = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(xt_buf.data_ptr<float>()) + 31) & ~uintptr_t(31));
  for (int64_t r0 = 0; r0 < M; r0 += 16) {
    const int64_t mb = std::min<int64_t>(16, M - r0), lanes = mb <= 8 ? 8 : 16;
    const bool few = mb <= kFewRows;
    if (!few)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t m = 0; m < lanes; ++m) xt[k * lanes + m] = m < mb ? a[(r0 + m) * K + k] : 0.f;
    // panels per tile: at most 12 accumulators (few rows: 6 panels x 2 rows, 3 x 3, 2 x 4: 3 x 4 would
    // need 12 accumulators + 4 broadcast rows + the weights, more than AVX2's 16 registers, and its
    // spills made 4 rows cost 10% more than 3; else 2 x 6 columns of 8 rows, or 1 x 6 columns of 16)
    const int64_t per = few ? (mb <= 2 ? 6 : mb == 3 ? 3 : 2) : (lanes == 8 ? 2 : 1);
    const int64_t tiles = (P + per - 1) / per;
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      alignas(32) float acc[6 * kPanel * 8];
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t p = t * per, np = std::min<int64_t>(per, P - p);
        const float* wt = wp + p * kPanel * K;
        if (few) {
          // whole tiles, then single panels at the end
          if (np == per && per == 6) tile_few_rows<6>(mb, a + r0 * K, wt, K, acc);
          else if (np == per && per == 3) tile_few_rows<3>(mb, a + r0 * K, wt, K, acc);
          else if (np == per) tile_few_rows<2>(mb, a + r0 * K, wt, K, acc);
          else for (int64_t q = 0; q < np; ++q) tile_few_rows<1>(mb, a + r0 * K, wt + q * kPanel * K, K, acc + q * kPanel * 8);
        } else if (lanes == 16) tile16(xt, wt, K, acc);
        else if (np == 2) tile8<2>(xt, wt, K, acc);
        else tile8<1>(xt, wt, K, acc);
        const int64_t col0 = p * kPanel, ncols = std::min<int64_t>(kPanel * np, n - col0);
        const int64_t stride = few ? 8 : lanes;
        for (int64_t m = 0; m < mb; ++m) {
          float* orow = o + (r0 + m) * n + col0;
          for (int64_t j = 0; j < ncols; ++j) orow[j] = acc[j * stride + m] + (bi ? bi[col0 + j] : 0.f);
        }
      }
    });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(specbench, m) { m.def("packed_linear(Tensor x, Tensor w, int n, Tensor? bias) -> Tensor"); }
TORCH_LIBRARY_IMPL(specbench, CPU, m) { m.impl("packed_linear", &packed_linear); }
