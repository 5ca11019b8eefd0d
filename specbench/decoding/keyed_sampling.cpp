// specbench::sample_keyed: the position-keyed sample of decoding/sampling.py on the CPU, the same token as
// argmax(scores + gumbel_noise(key, position)) row by row, ties and NaNs included, without drawing the row's
// noise over the whole vocabulary.
//
//   sample_keyed(scores [R, V] float32, key, positions: R ints, table [2^24] float32, low, high: [B] float32)
//     -> [R] int64. `table` holds the noise of each of the 2^24 uniforms the hash can give (sampling.py,
//     `gumbel_table`: the same floats as `_gumbel`), `low` and `high` its least and greatest value in each of
//     B equal runs of indices.
//
// Why: a noise row is a hash and two float64 logs per vocabulary entry, about 1 ms over SmolLM2's 49,152 on
// this CPU, paid for every sampled token, AR's included, and for every new position a tree reaches. Only the
// few entries whose score plus their run's `high` reaches the best score plus `low` can win, so a row costs
// one pass of the hash and a lookup in a table that stays in L1, then the exact sum for those few.
//
// The keyed noise is also read entry by entry by TR's coupled expansion (tree_expansion.cpp,
// `expand_coupled_keyed`), through `noise_row_key` and `keyed_gumbel` below.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "host_kernels.h"

#include <algorithm>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace specbench {

namespace {

inline uint32_t fmix32(uint32_t h) {  // MurmurHash3's finaliser, as sampling.py's _fmix32
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

inline uint32_t uniform_index(uint32_t row_key, uint32_t token) {  // the uniform's 24 bits: (h >> 8)
  return fmix32(fmix32(row_key ^ (token * 0x9E3779B1u))) >> 8;
}

constexpr int64_t kIndices = int64_t(1) << 24;

#ifdef __AVX2__
inline __m256i fmix32x8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(int32_t(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(int32_t(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

inline __m256i uniform_index8(uint32_t row_key, int32_t first) {  // uniform_index of tokens first .. first + 7
  const __m256i tok = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i h = _mm256_xor_si256(_mm256_set1_epi32(int32_t(row_key)),
                                     _mm256_mullo_epi32(tok, _mm256_set1_epi32(int32_t(0x9E3779B1u))));
  return _mm256_srli_epi32(fmix32x8(fmix32x8(h)), 8);
}

inline float horizontal_max(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float m = lanes[0];
  for (float l : lanes) m = l > m ? l : m;
  return m;
}
#endif

}  // namespace

// sampling.py's position term: the row's key for one (stream key, position)
uint32_t noise_row_key(uint32_t key, int64_t position) {
  const uint32_t p = fmix32(static_cast<uint32_t>(position * 2 + 1)) ^ key;  // the low 32 bits, as `& _M32`
  return fmix32(fmix32(p));
}

float keyed_gumbel(const float* table, uint32_t row_key, int64_t token) {
  return table[uniform_index(row_key, static_cast<uint32_t>(token))];
}

namespace host {

at::Tensor sample_keyed(const at::Tensor& scores, int64_t key, at::ArrayRef<int64_t> positions,
                        const at::Tensor& table, const at::Tensor& low, const at::Tensor& high) {
  TORCH_CHECK(scores.dim() == 2 && scores.scalar_type() == at::kFloat && scores.device().is_cpu() &&
                  scores.is_contiguous(), "sample_keyed: scores must be a contiguous [rows, vocab] float32 CPU tensor");
  TORCH_CHECK(static_cast<int64_t>(positions.size()) == scores.size(0), "sample_keyed: one position per row");
  TORCH_CHECK(table.scalar_type() == at::kFloat && table.numel() == kIndices && table.is_contiguous(),
              "sample_keyed: the table must hold 2^24 float32 values");
  const int64_t runs = low.numel();
  int shift = 0;
  while ((int64_t(1) << (24 - shift)) > runs) ++shift;
  TORCH_CHECK(runs >= 1 && (int64_t(1) << (24 - shift)) == runs && high.numel() == runs &&
                  low.scalar_type() == at::kFloat && high.scalar_type() == at::kFloat && low.is_contiguous() &&
                  high.is_contiguous(), "sample_keyed: low and high must be float32, one per run, a power of two");
  const int64_t rows = scores.size(0), vocab = scores.size(1);
  at::Tensor out = at::empty({rows}, scores.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  const float* g = table.data_ptr<float>();
  const float* lo = low.data_ptr<float>();
  const float* hi = high.data_ptr<float>();
  // every noise value lies in [g_min, g_max]
  const float g_min = *std::min_element(lo, lo + runs), g_max = *std::max_element(hi, hi + runs);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<uint32_t> idx(vocab);
#ifdef __AVX2__
  const __m128i vshift = _mm_cvtsi32_si128(shift);
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores.data_ptr<float>() + r * vocab;
    const uint32_t rk = noise_row_key(static_cast<uint32_t>(key), positions[r]);
    // the best score, and whether any is NaN (argmax then takes the first NaN, as torch and numpy)
    float top = -inf;
    bool nan = false;
    int64_t j = 0;
#ifdef __AVX2__
    __m256 vtop = _mm256_set1_ps(-inf), vnan = _mm256_setzero_ps();
    for (; j + 8 <= vocab; j += 8) {
      const __m256 sv = _mm256_loadu_ps(s + j);
      vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(sv, sv, _CMP_UNORD_Q));
      vtop = _mm256_max_ps(vtop, sv);
    }
    top = horizontal_max(vtop);
    nan = _mm256_movemask_ps(vnan) != 0;
#endif
    for (; j < vocab; ++j) {
      nan |= s[j] != s[j];
      top = s[j] > top ? s[j] : top;
    }
    int64_t pick = 0;
    if (nan) {
      while (!std::isnan(s[pick])) ++pick;
    } else if (top == inf) {  // an infinite score: the first
      while (s[pick] != inf) ++pick;
    } else if (top > -inf) {  // else every score is -inf: index 0, as argmax
      // Only an entry whose score plus the greatest noise reaches the best score's sum can win;
      // a block of 8 with none such is skipped unhashed. Margins: an entry that can tie the winner's float
      // sum is within an ulp of it, and the bounds' own roundings are ulps of values within 20 of the best:
      // 1e-5 x (32 + |value|) is many ulps wide.
      int64_t at = 0;
      while (s[at] != top) ++at;
      const float sure = top + g[uniform_index(rk, static_cast<uint32_t>(at))];  // the winner's is at least this
      const float reach = sure - g_max - 1e-5f * (32.f + std::abs(sure));
      // a lower bound of the winner's sum: every entry at its run's least noise
      float best_low = -inf;
      j = 0;
#ifdef __AVX2__
      const __m256 vreach = _mm256_set1_ps(reach);
      __m256 vbest = _mm256_set1_ps(-inf);
      for (; j + 8 <= vocab; j += 8) {
        const __m256 sv = _mm256_loadu_ps(s + j);
        if (!_mm256_movemask_ps(_mm256_cmp_ps(sv, vreach, _CMP_GE_OQ))) continue;
        const __m256i u = uniform_index8(rk, int32_t(j));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(&idx[j]), u);
        vbest = _mm256_max_ps(vbest, _mm256_add_ps(sv, _mm256_i32gather_ps(lo, _mm256_srl_epi32(u, vshift), 4)));
      }
      best_low = horizontal_max(vbest);
#endif
      for (int64_t t = j; t < vocab; ++t) {
        idx[t] = uniform_index(rk, static_cast<uint32_t>(t));
        const float l = s[t] + lo[idx[t] >> shift];
        best_low = l > best_low ? l : best_low;
      }
      const float floor = best_low - 1e-5f * (32.f + std::abs(best_low));
      float best = -inf;
      pick = -1;
      auto consider = [&](int64_t c) {  // in index order: the first of equal sums wins, as argmax
        const float v = s[c] + g[idx[c]];  // the float32 sum the full row adds
        if (pick < 0 || v > best) {
          best = v;
          pick = c;
        }
      };
      int64_t c = 0;
#ifdef __AVX2__
      // the blocks hashed above are a superset of those with an entry at or above this
      const __m256 vfloor = _mm256_set1_ps(floor), vfar = _mm256_set1_ps(std::max(reach, floor - g_max));
      for (; c + 8 <= vocab; c += 8) {
        const __m256 sv = _mm256_loadu_ps(s + c);
        if (!_mm256_movemask_ps(_mm256_cmp_ps(sv, vfar, _CMP_GE_OQ))) continue;
        const __m256i run = _mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&idx[c])), vshift);
        const __m256 up = _mm256_add_ps(sv, _mm256_i32gather_ps(hi, run, 4));
        for (int m = _mm256_movemask_ps(_mm256_cmp_ps(up, vfloor, _CMP_GE_OQ)); m; m &= m - 1)
          consider(c + __builtin_ctz(m));
      }
#endif
      for (; c < vocab; ++c)
        if (s[c] + hi[idx[c] >> shift] >= floor) consider(c);
    }
    o[r] = pick;
  }
  return out;
}

}  // namespace host

}  // namespace specbench

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("sample_keyed(Tensor scores, int key, int[] positions, Tensor table, Tensor low, Tensor high) -> Tensor");
}
TORCH_LIBRARY_IMPL(specbench, CPU, m) { m.impl("sample_keyed", &specbench::host::sample_keyed); }
