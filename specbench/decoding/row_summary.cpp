// specbench::row_summary(logits, k, normaliser) -> (values, indices, log_normaliser): for each row of a
// float32 [rows, vocab] tensor, its k largest logits (descending, ties by lower index) and, when asked,
// log(sum(exp(row))), in one pass over the row, for x86-64 CPUs with AVX2 and FMA.
//
// Why a kernel of our own: Token Recycling writes every verified row's top k into its matrix, and its
// adaptive and fused variants also keep the probability of each (exp(logit - log-normaliser)). On a
// CPU, torch's topk, log_softmax and logsumexp over a 49,152-token vocabulary each take a separate pass
// and cost 0.1-0.7 ms for one to ten rows, the drafter's largest host cost per step. Here a row is read
// once, 64 logits at a time: the block's maximum and, per vector lane, the lane's maximum and the sum
// of exp(logit - that maximum) (one vectorised exp per logit). The row's top k lie in the k blocks with the largest
// maxima (were an element of the top k outside them, those k maxima would all be at least as large), so
// the top k is chosen among those blocks' logits alone; the normaliser is the blocks' sums rescaled to
// the row's maximum.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "host_kernels.h"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;  // logits per block, 8 vectors of 8
// write_rows splits more rows than this over the intra-op threads (at::parallel_for's grain): with two threads
// 8 or more rows are summarised in about half the time (results/cpu-drafting-host/one-cache-parallel-rows.md)
constexpr int64_t kRowsPerThread = 2;

// 2^t for t <= 0 within 3e-6 relative: t = n + r (n the nearest integer, found by adding 1.5 x 2^23, which leaves
// n in the sum's low mantissa bits; r = t - n exact, |r| <= 1/2), 2^r by a degree-4 polynomial (fitted to 2^r in
// relative error; 1 at r = 0 exactly), n added to its exponent bits. Below 2^-126 the result is about 2^-126 rather
// than 0, which no softmax denominator can tell apart (every lane's sum holds a 1). The normaliser's exps are most
// of a verified row's summary, and their multiplies and FMAs share two ports: ten operations a vector with the
// scaling into base 2 (one FMA at the caller), where a rounding instruction, a conversion and a fifth polynomial
// term took thirteen (a row's normaliser 15 -> 13 us; a normaliser is a weighted mean of these errors, within 3e-6).
inline __m256 exp2_nonpositive(__m256 t) {
  const __m256 shift = _mm256_set1_ps(12582912.0f);  // 1.5 x 2^23
  t = _mm256_max_ps(t, _mm256_set1_ps(-126.0f));  // NaN (a lane of -inf logits, -inf - -inf) -> -126 too
  const __m256 k = _mm256_add_ps(t, shift);
  const __m256 r = _mm256_sub_ps(t, _mm256_sub_ps(k, shift));
  __m256 y = _mm256_set1_ps(9.582851286253346e-3f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.5906431470336165e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(2.4024098697054655e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(6.931241925705466e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
  const __m256i scale = _mm256_slli_epi32(_mm256_castps_si256(k), 23);  // n's low bits into the exponent
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), scale));
}

// exp(x - m) as 2^(x log2(e) - m log2(e)), with `m_log2e` = m log2(e) made once for many x
inline __m256 exp_below(__m256 x, __m256 m_log2e) {
  return exp2_nonpositive(_mm256_fmsub_ps(x, _mm256_set1_ps(1.44269504088896341f), m_log2e));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// (value, index) ordered as torch's sorted topk reads: larger value first, then lower index
inline bool before(float a, int64_t ia, float b, int64_t ib) { return a > b || (a == b && ia < ib); }

// Keeps the k best (value, index) pairs seen, best first: an insertion into a short sorted list
struct Best {
  std::vector<float> v;
  std::vector<int64_t> i;
  int64_t k, n = 0;
  explicit Best(int64_t k) : v(k), i(k), k(k) {}
  void offer(float value, int64_t index) {
    if (n == k && !before(value, index, v[k - 1], i[k - 1])) return;
    int64_t at = n < k ? n++ : k - 1;
    while (at > 0 && before(value, index, v[at - 1], i[at - 1])) {
      v[at] = v[at - 1];
      i[at] = i[at - 1];
      --at;
    }
    v[at] = value;
    i[at] = index;
  }
};

// One row: block maxima (and, per vector lane, sums of exp below the lane's maximum), then the top k
// among the best k blocks. The exps of a block wait only for their lanes' maxima, not for the block's:
// no horizontal reduction stands between a block's loads and its exps.
void summarise(const float* row, int64_t vocab, int64_t k, bool normaliser, float* values, int64_t* indices,
               float* log_norm) {
  const int64_t blocks = (vocab + kBlock - 1) / kBlock, full = vocab / kBlock;
  std::vector<float> bmax(blocks), lmax(normaliser ? 8 * full : 0), lsum(normaliser ? 8 * full : 0);
  float tail_sum = 0.f, tail_max = -INFINITY;
  for (int64_t b = 0; b < full; ++b) {
    const float* p = row + b * kBlock;
    __m256 v[8];
    for (int j = 0; j < 8; ++j) v[j] = _mm256_loadu_ps(p + 8 * j);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])),
                                   _mm256_max_ps(_mm256_max_ps(v[4], v[5]), _mm256_max_ps(v[6], v[7])));
    if (normaliser) {
      const __m256 ml = _mm256_mul_ps(m, _mm256_set1_ps(1.44269504088896341f));
      __m256 s0 = exp_below(v[0], ml), s1 = exp_below(v[1], ml);
      for (int j = 2; j < 8; j += 2) {
        s0 = _mm256_add_ps(s0, exp_below(v[j], ml));
        s1 = _mm256_add_ps(s1, exp_below(v[j + 1], ml));
      }
      _mm256_storeu_ps(&lmax[8 * b], m);
      _mm256_storeu_ps(&lsum[8 * b], _mm256_add_ps(s0, s1));
    }
    bmax[b] = hmax(m);
  }
  if (full < blocks) {  // the vocabulary's last, short block
    const float* p = row + full * kBlock;
    const int64_t len = vocab - full * kBlock;
    for (int64_t j = 0; j < len; ++j) tail_max = std::max(tail_max, p[j]);
    bmax[full] = tail_max;
    if (normaliser && tail_max > -INFINITY)  // all masked: nothing to add (and -inf - -inf is NaN)
      for (int64_t j = 0; j < len; ++j) tail_sum += std::exp(p[j] - tail_max);
  }
  Best best_blocks(std::min(k, blocks));
  for (int64_t b = 0; b < blocks; ++b) best_blocks.offer(bmax[b], b);
  Best best(k);
  for (int64_t j = 0; j < best_blocks.n; ++j) {
    const int64_t b = best_blocks.i[j], start = b * kBlock, len = std::min<int64_t>(kBlock, vocab - start);
    for (int64_t t = 0; t < len; ++t) best.offer(row[start + t], start + t);
  }
  for (int64_t j = 0; j < k; ++j) {
    values[j] = best.v[j];
    indices[j] = best.i[j];
  }
  if (normaliser) {  // every lane's sum rescaled to the row's maximum
    const float top = best_blocks.v[0];
    const __m256 tl = _mm256_set1_ps(top * 1.44269504088896341f);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < full; ++b)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(&lsum[8 * b]), exp_below(_mm256_loadu_ps(&lmax[8 * b]), tl), acc);
    double s = hsum(acc);
    if (full < blocks && tail_sum > 0.f) s += double(tail_sum) * std::exp(double(tail_max) - double(top));
    *log_norm = float(double(top) + std::log(s));
  }
}

// One row of the coupling tables a coupled expansion reads (drafting/recycling.py's `coupling_tables`, which
// says what they mean), from the row's k probabilities: -log(p) / T per candidate, and the log of the tail
// bound (1 - sum p) p_min^(1/T - 1).
void coupling_row(const float* p, int64_t k, float inv_t, float* neg_log_p, float* log_tail) {
  float sum = 0.f, least = p[0];
  for (int64_t j = 0; j < k; ++j) {
    neg_log_p[j] = -(std::log(p[j]) * inv_t);
    sum += p[j];
    least = std::min(least, p[j]);
  }
  *log_tail = std::log(std::max(1.f - sum, 0.f) * std::pow(least, inv_t - 1.f));
}

void check_tables(const at::Tensor& neg_log_p, const at::Tensor& log_tail, int64_t rows, int64_t k) {
  TORCH_CHECK(neg_log_p.scalar_type() == at::kFloat && neg_log_p.is_contiguous() && neg_log_p.dim() == 2 &&
                  neg_log_p.size(0) == rows && neg_log_p.size(1) == k && log_tail.scalar_type() == at::kFloat &&
                  log_tail.is_contiguous() && log_tail.numel() == rows,
              "coupling tables: float32 (rows, k) and (rows,), contiguous");
}

}  // namespace

namespace specbench::host {

std::tuple<at::Tensor, at::Tensor, at::Tensor> row_summary(const at::Tensor& logits, int64_t k, bool normaliser) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "row_summary takes a 2-D float32 CPU tensor");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(k >= 1 && k <= vocab, "row_summary needs 1 <= k <= vocab, got k=", k, " for ", vocab);
  const at::Tensor x = logits.contiguous();
  at::Tensor values = at::empty({rows, k}, x.options());
  at::Tensor indices = at::empty({rows, k}, x.options().dtype(at::kLong));
  at::Tensor log_norm = at::empty({normaliser ? rows : 0}, x.options());
  const float* src = x.data_ptr<float>();
  float* v = values.data_ptr<float>();
  int64_t* ix = indices.data_ptr<int64_t>();
  float* ln = log_norm.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      summarise(src + r * vocab, vocab, k, normaliser, v + r * k, ix + r * k, normaliser ? ln + r : nullptr);
  });
  return {values, indices, log_norm};
}

// specbench::coupling_tables(probs, temperature) -> (neg_log_p, log_tail) of every row of a (rows, k) float32 tensor
std::tuple<at::Tensor, at::Tensor> coupling_tables(const at::Tensor& probs, double temperature) {
  TORCH_CHECK(probs.dim() == 2 && probs.scalar_type() == at::kFloat && probs.device().is_cpu(),
              "coupling_tables takes (rows, k) float32 CPU probabilities");
  const at::Tensor p = probs.contiguous();
  const int64_t rows = p.size(0), k = p.size(1);
  at::Tensor neg_log_p = at::empty({rows, k}, p.options()), log_tail = at::empty({rows}, p.options());
  const float inv_t = static_cast<float>(1.0 / temperature);
  for (int64_t r = 0; r < rows; ++r)
    coupling_row(p.data_ptr<float>() + r * k, k, inv_t, neg_log_p.data_ptr<float>() + r * k,
                 log_tail.data_ptr<float>() + r);
  return {neg_log_p, log_tail};
}

// specbench::write_rows(logits, root, draft_tokens, matrix, written, probs, neg_log_p, log_tail, temperature)
// -> the written rows' probabilities: a step's verified rows written into Token Recycling's matrix in one call.
// Row 0 is the root's, row i the draft's i-th token's; each token's matrix row <- its row's top k, `written` <-
// true and, with `probs`, the k probabilities exp(logit - log-normaliser) (ATen's sub and exp, the same floats
// as the ops a step made before) and, with the coupling tables, their rows at `temperature` (as
// `coupling_tables` makes them). Rows are written in order, so a token on several rows keeps its last row's, as
// in `Recycling.write`. Returns the (rows, k) probabilities (empty without `probs`).
at::Tensor write_rows(const at::Tensor& logits, int64_t root, const c10::optional<at::Tensor>& draft_tokens,
                      at::Tensor matrix, at::Tensor written, const c10::optional<at::Tensor>& probs,
                      const c10::optional<at::Tensor>& neg_log_p, const c10::optional<at::Tensor>& log_tail,
                      double temperature) {
  const int64_t drafted = draft_tokens.has_value() ? draft_tokens->numel() : 0, rows = 1 + drafted;
  const int64_t k = matrix.size(1), vocab = matrix.size(0);
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu() &&
                  logits.size(0) >= rows && logits.stride(1) == 1,
              "write_rows takes float32 CPU logits with a row for the root and each drafted token");
  TORCH_CHECK(matrix.scalar_type() == at::kInt && matrix.is_contiguous() && written.scalar_type() == at::kBool &&
                  written.is_contiguous() && k >= 1 && k <= logits.size(1),
              "write_rows takes an int32 (vocab, k) matrix and a bool (vocab,) written flag");
  const bool with_probs = probs.has_value();
  const bool with_tables = neg_log_p.has_value() && log_tail.has_value();
  TORCH_CHECK(!with_tables || with_probs, "write_rows: the coupling tables are made from the probabilities");
  at::Tensor values = at::empty({rows, k}, logits.options());
  at::Tensor indices = at::empty({rows, k}, logits.options().dtype(at::kLong));
  at::Tensor log_norm = at::empty({rows, 1}, logits.options());
  std::vector<int64_t> tokens(rows);
  tokens[0] = root;
  if (drafted) {
    const at::Tensor t = draft_tokens->to(at::kLong).contiguous();
    std::copy(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + drafted, tokens.begin() + 1);
  }
  for (int64_t r = 0; r < rows; ++r)
    TORCH_CHECK(tokens[r] >= 0 && tokens[r] < vocab, "write_rows: token ", tokens[r], " outside the matrix");
  // Rows are summarised on the intra-op threads (the forward's, idle now): a row reads 192 KiB that the
  // forward has pushed out of the caches, and two cores read it faster than one. Each row's summary is its
  // own, so the result does not depend on the split; the writes below stay in row order.
  const float* row0 = logits.data_ptr<float>();
  const int64_t stride = logits.stride(0), width = logits.size(1);
  float *vals = values.data_ptr<float>(), *norms = log_norm.data_ptr<float>();
  int64_t* idx = indices.data_ptr<int64_t>();
  at::parallel_for(0, rows, kRowsPerThread, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      summarise(row0 + r * stride, width, k, with_probs, vals + r * k, idx + r * k, with_probs ? norms + r : nullptr);
  });
  int32_t* m = matrix.data_ptr<int32_t>();
  bool* w = written.data_ptr<bool>();
  const int64_t* ix = indices.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) m[tokens[r] * k + j] = static_cast<int32_t>(ix[r * k + j]);
    w[tokens[r]] = true;
  }
  if (!with_probs) return at::empty({0}, logits.options());
  TORCH_CHECK(probs->scalar_type() == at::kFloat && probs->is_contiguous() && probs->size(1) == k,
              "write_rows takes float32 (vocab, k) probabilities");
  const at::Tensor p = (values - log_norm).exp();
  float* dst = probs->data_ptr<float>();
  const float* src = p.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) std::copy(src + r * k, src + (r + 1) * k, dst + tokens[r] * k);
  if (with_tables) {  // from the rows as finally written: a token on several rows, once, from its last
    check_tables(*neg_log_p, *log_tail, vocab, k);
    const float inv_t = static_cast<float>(1.0 / temperature);
    for (int64_t r = 0; r < rows; ++r)
      coupling_row(dst + tokens[r] * k, k, inv_t, neg_log_p->data_ptr<float>() + tokens[r] * k,
                   log_tail->data_ptr<float>() + tokens[r]);
  }
  return p;
}

}  // namespace specbench::host

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("row_summary(Tensor logits, int k, bool normaliser) -> (Tensor, Tensor, Tensor)");
  m.def("write_rows(Tensor logits, int root, Tensor? draft_tokens, Tensor(a!) matrix, Tensor(b!) written, "
        "Tensor(c!)? probs, Tensor(d!)? neg_log_p=None, Tensor(e!)? log_tail=None, float temperature=1.0) -> Tensor");
  m.def("coupling_tables(Tensor probs, float temperature) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(specbench, CPU, m) {
  m.impl("row_summary", &specbench::host::row_summary);
  m.impl("write_rows", &specbench::host::write_rows);
  m.impl("coupling_tables", &specbench::host::coupling_tables);
}
