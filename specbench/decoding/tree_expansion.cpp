// specbench::expand_template and specbench::expand_coupled: Token Recycling's template expanded from its
// adjacency matrix on the CPU, node by node, parents first (drafting/recycling.py holds the same two
// expansions in numpy and says what they mean).
//
// Why a kernel of our own: the expansion is a handful of gathers per depth of the template, each a
// numpy call of a few microseconds over a few dozen elements, and at T > 0 a sort of every parent's
// candidates by the target's own draw. Per step that was 0.1 ms at T = 0 and 0.4 ms at T = 0.7 of
// `tr_fused`'s host work; here it is one call.
//
//   expand_template(matrix [V, k] int32, probs [V, k] float32 or none, parent, rank: [n] int64, root)
//     -> (tokens [n] int64, confidences [n] float32, empty without probs): node v's token is rank[v] of
//     its parent's token's row, its confidence that entry's probability; node 0 is the root.
//   expand_coupled(matrix, probs, neg_log_p [V, k] float32, log_tail [V] float32, noise: per depth a
//     [V] float32 row, parent, rank, depth: [n] int64, root) -> (tokens, confidences): a parent's
//     candidates ordered by -(log p / T + g) ascending (neg_log_p - g, ties by rank), g the noise row at
//     the parent's depth; the confidence of a rank-0 node with p > 0 is exp(-exp(log_tail + score)),
//     of any other node its probability (recycling.py, `coupled_expansion`).
//   expand_coupled_keyed(matrix, probs, neg_log_p, log_tail, key, positions, table, parent, rank, depth, root):
//     expand_coupled with the noise read entry by entry from the sampler's stream key and each depth's
//     position (keyed_sampling.cpp), not from rows drawn over the whole vocabulary.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "host_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace specbench {  // keyed_sampling.cpp: the position-keyed noise, entry by entry
uint32_t noise_row_key(uint32_t key, int64_t position);
float keyed_gumbel(const float* table, uint32_t row_key, int64_t token);
}  // namespace specbench

namespace {

using specbench::keyed_gumbel;
using specbench::noise_row_key;

void check_tree(const at::Tensor& matrix, const at::Tensor& parent, const at::Tensor& rank, int64_t root) {
  TORCH_CHECK(matrix.dim() == 2 && matrix.scalar_type() == at::kInt && matrix.device().is_cpu() &&
                  matrix.is_contiguous(), "expand: the matrix must be a contiguous [vocab, k] int32 CPU tensor");
  TORCH_CHECK(parent.scalar_type() == at::kLong && rank.scalar_type() == at::kLong && parent.dim() == 1 &&
                  rank.sizes() == parent.sizes() && parent.is_contiguous() && rank.is_contiguous(),
              "expand: parent and rank must be contiguous 1-D int64 tensors of one length");
  TORCH_CHECK(parent.numel() >= 1, "expand: the template needs its root");
  TORCH_CHECK(root >= 0 && root < matrix.size(0), "expand: root ", root, " outside the vocabulary");
  const int64_t* par = parent.data_ptr<int64_t>();
  const int64_t* rk = rank.data_ptr<int64_t>();
  for (int64_t v = 1; v < parent.numel(); ++v)
    TORCH_CHECK(par[v] >= 0 && par[v] < v && rk[v] >= 0 && rk[v] < matrix.size(1),
                "expand: node ", v, " must follow its parent and name one of the row's k candidates");
}

// Node by node, parents first; `noise(d, token)` is the target's noise at the position of depth d's parents.
template <typename Noise>
std::tuple<at::Tensor, at::Tensor> coupled(const at::Tensor& matrix, const at::Tensor& probs,
                                           const at::Tensor& neg_log_p, const at::Tensor& log_tail,
                                           int64_t depths, const Noise& noise, const at::Tensor& parent,
                                           const at::Tensor& rank, const at::Tensor& depth, int64_t root) {
  check_tree(matrix, parent, rank, root);
  const int64_t vocab = matrix.size(0), k = matrix.size(1), n = parent.numel();
  for (const at::Tensor* x : {&probs, &neg_log_p})
    TORCH_CHECK(x->scalar_type() == at::kFloat && x->sizes() == matrix.sizes() && x->is_contiguous(),
                "expand_coupled: probs and neg_log_p must be contiguous float32 tensors shaped as the matrix");
  TORCH_CHECK(log_tail.scalar_type() == at::kFloat && log_tail.numel() == vocab && log_tail.is_contiguous(),
              "expand_coupled: log_tail must hold one float32 per vocabulary row");
  TORCH_CHECK(depth.scalar_type() == at::kLong && depth.sizes() == parent.sizes() && depth.is_contiguous(),
              "expand_coupled: depth must be shaped as parent");
  const int64_t* dp = depth.data_ptr<int64_t>();
  for (int64_t v = 1; v < n; ++v)
    TORCH_CHECK(dp[v] >= 1 && dp[v] <= depths, "expand_coupled: no noise for node ", v, "'s parent (depth ", dp[v],
                ")");
  at::Tensor tokens = at::empty({n}, parent.options());
  at::Tensor conf = at::empty({n}, probs.options());
  const int32_t* m = matrix.data_ptr<int32_t>();
  const float* p = probs.data_ptr<float>();
  const float* nlp = neg_log_p.data_ptr<float>();
  const float* tail = log_tail.data_ptr<float>();
  const int64_t* par = parent.data_ptr<int64_t>();
  const int64_t* rk = rank.data_ptr<int64_t>();
  int64_t* t = tokens.data_ptr<int64_t>();
  float* c = conf.data_ptr<float>();
  t[0] = root;
  c[0] = 1.f;
  std::vector<float> score(k);
  std::vector<int64_t> order(k);
  int64_t sorted_for = -1;  // the parent whose candidates `order` holds
  for (int64_t v = 1; v < n; ++v) {
    const int64_t src = t[par[v]];
    const int32_t* cand = m + src * k;
    // Siblings share their parent's order: each noise entry is a read at random in a 64 MB table, mostly a
    // cache miss, so it is read once per parent, not once per child.
    if (par[v] != sorted_for) {
      for (int64_t j = 0; j < k; ++j) {
        score[j] = nlp[src * k + j] - noise(dp[v] - 1, cand[j]);
        order[j] = j;
      }
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] < score[b]; });
      sorted_for = par[v];
    }
    const int64_t pick = order[rk[v]];
    const float prob = p[src * k + pick];
    t[v] = cand[pick];
    // the chance that no token outside the row's top k beats the pick, given the row (as numpy: float32)
    c[v] = (rk[v] == 0 && prob > 0.f) ? std::exp(-std::exp(tail[src] + score[pick])) : prob;
  }
  return {tokens, conf};
}

}  // namespace

namespace specbench::host {

std::tuple<at::Tensor, at::Tensor> expand_template(const at::Tensor& matrix, const c10::optional<at::Tensor>& probs,
                                                   const at::Tensor& parent, const at::Tensor& rank, int64_t root) {
  check_tree(matrix, parent, rank, root);
  const bool with_conf = probs.has_value();
  if (with_conf)
    TORCH_CHECK(probs->scalar_type() == at::kFloat && probs->sizes() == matrix.sizes() && probs->is_contiguous(),
                "expand: probs must be a contiguous float32 tensor shaped as the matrix");
  const int64_t n = parent.numel(), k = matrix.size(1);
  at::Tensor tokens = at::empty({n}, parent.options());
  at::Tensor conf = at::empty({with_conf ? n : 0}, matrix.options().dtype(at::kFloat));
  const int32_t* m = matrix.data_ptr<int32_t>();
  const float* p = with_conf ? probs->data_ptr<float>() : nullptr;
  const int64_t* par = parent.data_ptr<int64_t>();
  const int64_t* rk = rank.data_ptr<int64_t>();
  int64_t* t = tokens.data_ptr<int64_t>();
  float* c = with_conf ? conf.data_ptr<float>() : nullptr;
  t[0] = root;
  if (with_conf) c[0] = 1.f;
  for (int64_t v = 1; v < n; ++v) {
    const int64_t at = t[par[v]] * k + rk[v];
    t[v] = m[at];
    if (with_conf) c[v] = p[at];
  }
  return {tokens, conf};
}

std::tuple<at::Tensor, at::Tensor> expand_coupled(const at::Tensor& matrix, const at::Tensor& probs,
                                                  const at::Tensor& neg_log_p, const at::Tensor& log_tail,
                                                  at::TensorList noise, const at::Tensor& parent,
                                                  const at::Tensor& rank, const at::Tensor& depth, int64_t root) {
  std::vector<const float*> rows;
  for (const at::Tensor& g : noise) {
    TORCH_CHECK(g.scalar_type() == at::kFloat && g.numel() == matrix.size(0) && g.is_contiguous(),
                "expand_coupled: each noise row must be a contiguous float32 row of the vocabulary");
    rows.push_back(g.data_ptr<float>());
  }
  return coupled(matrix, probs, neg_log_p, log_tail, int64_t(rows.size()),
                 [&](int64_t d, int32_t token) { return rows[d][token]; }, parent, rank, depth, root);
}

std::tuple<at::Tensor, at::Tensor> expand_coupled_keyed(const at::Tensor& matrix, const at::Tensor& probs,
                                                        const at::Tensor& neg_log_p, const at::Tensor& log_tail,
                                                        int64_t key, at::ArrayRef<int64_t> positions,
                                                        const at::Tensor& table, const at::Tensor& parent,
                                                        const at::Tensor& rank, const at::Tensor& depth, int64_t root) {
  TORCH_CHECK(table.scalar_type() == at::kFloat && table.numel() == (int64_t(1) << 24) && table.is_contiguous(),
              "expand_coupled_keyed: the table must hold 2^24 float32 values (sampling.py, gumbel_table)");
  std::vector<uint32_t> row_keys;
  for (int64_t p : positions) row_keys.push_back(noise_row_key(static_cast<uint32_t>(key), p));
  const float* g = table.data_ptr<float>();
  return coupled(matrix, probs, neg_log_p, log_tail, int64_t(row_keys.size()),
                 [&](int64_t d, int32_t token) { return keyed_gumbel(g, row_keys[d], token); }, parent, rank,
                 depth, root);
}

}  // namespace specbench::host

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("expand_template(Tensor matrix, Tensor? probs, Tensor parent, Tensor rank, int root) -> (Tensor, Tensor)");
  m.def("expand_coupled(Tensor matrix, Tensor probs, Tensor neg_log_p, Tensor log_tail, Tensor[] noise, "
        "Tensor parent, Tensor rank, Tensor depth, int root) -> (Tensor, Tensor)");
  m.def("expand_coupled_keyed(Tensor matrix, Tensor probs, Tensor neg_log_p, Tensor log_tail, int key, "
        "int[] positions, Tensor table, Tensor parent, Tensor rank, Tensor depth, int root) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(specbench, CPU, m) {
  m.impl("expand_template", &specbench::host::expand_template);
  m.impl("expand_coupled", &specbench::host::expand_coupled);
  m.impl("expand_coupled_keyed", &specbench::host::expand_coupled_keyed);
}
