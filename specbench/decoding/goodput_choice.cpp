// The goodput chooser's host work for TR's template (methods/tr/adaptive.py), each in one call and in the
// same doubles as the numpy it replaces:
//
//   template_probabilities(conf, node_cells, parents, bins, group, agreed, agreed_offset, trials, hits, prior,
//     weight, prior_steps, pools, pool_trials, pool_hits, pool_prior, pool_weight)
//     -> (cells, p): every template node's rate cell (`GoodputSubtree._cells`: its confidence conf[v]
//     binned into `bins` bins, bin `bins` for an entry never written, plus the node's own cell, the
//     context bucket's `group` and, for the nodes in `agreed`, `agreed_offset`) and its estimate
//     p(v) = p(parent) x q(cell) (`GoodputSubtree.probabilities`; conf and p: root first / not), q made for
//     those cells alone from the rate table's counts (`RateTable.terms`), the same doubles as its `rate_array`.
//   choose_nodes(p, parents, step_times, min_gain, max_nodes) -> node ids: the sub-tree
//     (speculation/goodput.py's `choose_nodes`, which says what it means): p capped by each parent's
//     value, the nodes in decreasing order (ties by id), the running sum 1 + p_1 + ... + p_m over
//     t(m + 1), the first best m, taken when it beats the plain step by 1 + min_gain.
//   learn_counterfactual(tokens, seq, from, length, kid_start, kids, cells, trials, hits, weight, pools, pool_trials,
//     pool_hits, pool_weight) -> the path's length: one step's counterfactual outcome counted (`GoodputSubtree._learn`).
//     The template nodes the decided tokens cont = seq[from : from + length] would have reached (speculation/goodput.py's
//     `counterfactual_path`: at each node the first child holding the next token; tokens: the step's template,
//     root first; node v's children kids[kid_start[v] .. kid_start[v + 1])), then a trial of cell cells[c - 1]
//     for every child c of the root and of each node on that path, in that order, a hit where c is on the path:
//     trials[cell] += weight, hits[cell] += weight or 0 (RateTable.add_many's np.add.at: the same doubles, in
//     the same order); with `pools` (a PooledRateTable's), the same into each cell's pool.
//   template_bucket(tokens, seq, from, kid_start, kids) -> 0 or 1: a step's context bucket (`GoodputSubtree._bucket`):
//     the decided tokens seq[from:] (the previous step's emitted tokens, this step's root last) walked down the
//     previous step's template (tokens, root first; children as for learn_counterfactual), each at the first child
//     holding it: 1 when the walk leaves the template below a leaf (a fully predicted chain) or ends at a rank-0
//     child, 0 when a token is no child's or the last is a later rank's (or there is none).
//
// Why kernels of our own: TR's adaptive and fused drafters estimate and choose every step; in numpy each
// is a Python pass over the template and a handful of array calls of a few microseconds, together about
// a tenth of a millisecond a step of host work.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "host_kernels.h"

#include <algorithm>
#include <numeric>
#include <tuple>
#include <vector>

namespace specbench::host {

std::vector<int64_t> choose_nodes(at::ArrayRef<double> p, at::ArrayRef<int64_t> parents,
                                  at::ArrayRef<double> step_times, double min_gain, c10::optional<int64_t> max_nodes) {
  const int64_t n = static_cast<int64_t>(p.size());
  TORCH_CHECK(static_cast<int64_t>(parents.size()) == n, "choose_nodes: one parent per node");
  std::vector<double> q(p.begin(), p.end());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t par = parents[i];
    TORCH_CHECK(par >= 0 && par <= i, "choose_nodes: node ", i + 1, " must follow its parent");
    if (par && q[i] > q[par - 1]) q[i] = q[par - 1];
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return -q[a] < -q[b]; });
  const int64_t kept = max_nodes.has_value() ? std::max<int64_t>(0, std::min(n, *max_nodes)) : n;
  TORCH_CHECK(static_cast<int64_t>(step_times.size()) >= kept + 1, "choose_nodes: need forward times for 1..",
              kept + 1, " rows, got ", step_times.size());
  std::vector<int64_t> chosen;
  if (kept == 0) return chosen;
  double expected = 1.0, best = 0.0;
  int64_t m = -1;
  for (int64_t j = 0; j < kept; ++j) {
    expected += q[order[j]];
    const double rate = expected / step_times[j + 1];
    if (m < 0 || rate > best) best = rate, m = j;  // the first of equal maxima
  }
  if (!(best > (1.0 / step_times[0]) * (1.0 + min_gain))) return chosen;
  chosen.assign(order.begin(), order.begin() + m + 1);
  std::sort(chosen.begin(), chosen.end());
  for (auto& v : chosen) ++v;
  return chosen;
}

}  // namespace specbench::host

namespace {

// `RateTable.rate_array`'s q of one cell, the same double: (hits + pm * base) / (trials + pm), pm = prior_steps x
// weight; without a prior (pm = 0) a cell never tried keeps its base. The product is kept out of an FMA (the
// empty asm makes it a value of its own): numpy rounds it before the sum, and so must this.
inline double shrunk_rate(double hits, double trials, double base, double pm) {
  double shrink = pm * base;
  asm("" : "+x"(shrink));
  const double denom = trials + pm;
  if (!(pm > 0) && !(denom > 0)) return base;
  return (hits + shrink) / denom;
}

// A RateTable's arrays (`RateTable.terms`), pooled or not: q(cell) as its `rate_array` makes it
struct RateTerms {
  const double *trials, *hits, *prior;
  double pm;
  const int64_t* pools;  // null: no pools, the prior is the base
  const double *pool_trials, *pool_hits, *pool_prior;
  double pool_pm;
  int64_t pool_count;

  double operator()(int64_t c) const {
    double base = prior[c];
    if (pools) {
      const int64_t g = pools[c];
      TORCH_CHECK(g >= 0 && g < pool_count, "template_probabilities: cell ", c, "'s pool is out of range");
      base = shrunk_rate(pool_hits[g], pool_trials[g], pool_prior[g], pool_pm);
    }
    return shrunk_rate(hits[c], trials[c], base, pm);
  }
};

const double* doubles(const at::Tensor& t, int64_t n, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kDouble && t.is_contiguous() && t.numel() == n, "template_probabilities: ",
              what, " must be ", n, " contiguous float64 values");
  return t.data_ptr<double>();
}

}  // namespace

namespace specbench::host {

std::tuple<at::Tensor, std::vector<double>> template_probabilities(
    const at::Tensor& conf, const at::Tensor& node_cells, const at::Tensor& parents, int64_t bins, int64_t group,
    at::ArrayRef<int64_t> agreed, int64_t agreed_offset, const at::Tensor& trials, const at::Tensor& hits,
    const at::Tensor& prior, double weight, double prior_steps, const at::Tensor& pools,
    const at::Tensor& pool_trials, const at::Tensor& pool_hits, const at::Tensor& pool_prior, double pool_weight) {
  const int64_t table = prior.numel(), pooled = pools.numel(), groups = pool_prior.numel();
  RateTerms q{doubles(trials, table, "trials"), doubles(hits, table, "hits"), doubles(prior, table, "the prior"),
              prior_steps * weight, nullptr, nullptr, nullptr, nullptr, prior_steps * pool_weight, groups};
  if (pooled) {
    TORCH_CHECK(pools.scalar_type() == at::kLong && pools.is_contiguous() && pooled == table,
                "template_probabilities: one int64 pool per cell");
    q.pools = pools.data_ptr<int64_t>();
    q.pool_trials = doubles(pool_trials, groups, "pool trials");
    q.pool_hits = doubles(pool_hits, groups, "pool hits");
    q.pool_prior = doubles(pool_prior, groups, "the pools' prior");
  }
  const int64_t n = node_cells.numel();
  TORCH_CHECK(conf.scalar_type() == at::kFloat && conf.is_contiguous() && conf.numel() == n + 1 &&
                  node_cells.scalar_type() == at::kLong && node_cells.is_contiguous() &&
                  parents.scalar_type() == at::kLong && parents.is_contiguous() && parents.numel() == n,
              "template_probabilities: float32 confidences (root first), int64 cells and parents");
  at::Tensor cells = at::empty({n}, node_cells.options());
  int64_t* cell = cells.data_ptr<int64_t>();
  const float* c = conf.data_ptr<float>() + 1;
  const int64_t* own = node_cells.data_ptr<int64_t>();
  for (int64_t v = 0; v < n; ++v) {
    const double x = c[v];  // binned in double precision, as numpy bins the float32 confidences
    cell[v] = own[v] + group + (x > 0 ? std::min<int64_t>(static_cast<int64_t>(x * bins), bins - 1) : bins);
  }
  for (const int64_t v : agreed) {
    TORCH_CHECK(v >= 1 && v <= n, "template_probabilities: agreed node ", v, " is not in the template");
    cell[v - 1] += agreed_offset;
  }
  const int64_t* par = parents.data_ptr<int64_t>();
  std::vector<double> p(n);
  for (int64_t v = 0; v < n; ++v) {
    TORCH_CHECK(cell[v] >= 0 && cell[v] < table && par[v] >= 0 && par[v] <= v,
                "template_probabilities: node ", v + 1, "'s cell or parent is out of range");
    p[v] = (par[v] ? p[par[v] - 1] : 1.0) * q(cell[v]);  // parents precede their children
  }
  return {cells, p};
}

int64_t learn_counterfactual(const at::Tensor& tokens, const at::Tensor& seq, int64_t from, int64_t length,
                             const at::Tensor& kid_start,
                             const at::Tensor& kids, const at::Tensor& cells, at::Tensor trials, at::Tensor hits,
                             double weight, const at::Tensor& pools, at::Tensor pool_trials, at::Tensor pool_hits,
                             double pool_weight) {
  const int64_t n = cells.numel(), table = trials.numel(), pooled = pools.numel();
  for (const at::Tensor* t : {&tokens, &seq, &kid_start, &kids, &cells, &pools})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->device().is_cpu(),
                "learn_counterfactual: int64 contiguous CPU tokens, sequence, children, cells and pools");
  TORCH_CHECK(seq.dim() == 1 && from >= 0 && length >= 0, "learn_counterfactual: a 1-D sequence, a span within it");
  // the span as a slice reads it: what lies past the sequence's end is not decided yet
  const int64_t decided = std::max<int64_t>(0, std::min(length, seq.numel() - from));
  for (const at::Tensor* t : {&trials, &hits, &pool_trials, &pool_hits})
    TORCH_CHECK(t->scalar_type() == at::kDouble && t->is_contiguous(), "learn_counterfactual: float64 counts");
  TORCH_CHECK(tokens.numel() == n + 1 && kid_start.numel() == n + 2 && kids.numel() == n && hits.numel() == table &&
                  (pooled == 0 || (pooled == table && pool_hits.numel() == pool_trials.numel())),
              "learn_counterfactual: one cell per template node, children in CSR form, matching count tables");
  const int64_t* tok = tokens.data_ptr<int64_t>();
  const int64_t* start = kid_start.data_ptr<int64_t>();
  const int64_t* kid = kids.data_ptr<int64_t>();
  const int64_t* next = seq.data_ptr<int64_t>() + std::min(from, seq.numel());
  std::vector<int64_t> on_path{0};  // the root, then the path
  std::vector<char> hit(n + 1, 0);
  for (int64_t d = 0, node = 0; d < decided; ++d) {
    int64_t found = -1;
    for (int64_t i = start[node]; i < start[node + 1] && found < 0; ++i)
      if (tok[kid[i]] == next[d]) found = kid[i];
    if (found < 0) break;
    on_path.push_back(found);
    hit[found] = 1;
    node = found;
  }
  const int64_t* cell = cells.data_ptr<int64_t>();
  double* t = trials.data_ptr<double>();
  double* h = hits.data_ptr<double>();
  for (const int64_t v : on_path)
    for (int64_t i = start[v]; i < start[v + 1]; ++i) {
      const int64_t c = cell[kid[i] - 1];
      TORCH_CHECK(c >= 0 && c < table, "learn_counterfactual: cell ", c, " outside the table");
      t[c] += weight;
      h[c] += hit[kid[i]] ? weight : 0.0;
    }
  if (pooled) {
    const int64_t* pool = pools.data_ptr<int64_t>();
    double* pt = pool_trials.data_ptr<double>();
    double* ph = pool_hits.data_ptr<double>();
    for (const int64_t v : on_path)
      for (int64_t i = start[v]; i < start[v + 1]; ++i) {
        const int64_t g = pool[cell[kid[i] - 1]];
        TORCH_CHECK(g >= 0 && g < pool_trials.numel(), "learn_counterfactual: pool ", g, " outside the table");
        pt[g] += pool_weight;
        ph[g] += hit[kid[i]] ? pool_weight : 0.0;
      }
  }
  return static_cast<int64_t>(on_path.size()) - 1;
}

int64_t template_bucket(const at::Tensor& tokens, const at::Tensor& seq, int64_t from, const at::Tensor& kid_start,
                        const at::Tensor& kids) {
  for (const at::Tensor* t : {&tokens, &seq, &kid_start, &kids})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->device().is_cpu(),
                "template_bucket: int64 contiguous CPU tokens, sequence and children");
  const int64_t n = tokens.numel() - 1;
  TORCH_CHECK(seq.dim() == 1 && from >= 0 && kid_start.numel() == n + 2 && kids.numel() == n,
              "template_bucket: a 1-D sequence, children in CSR form for every template node");
  const int64_t* tok = tokens.data_ptr<int64_t>();
  const int64_t* start = kid_start.data_ptr<int64_t>();
  const int64_t* kid = kids.data_ptr<int64_t>();
  const int64_t* next = seq.data_ptr<int64_t>();
  bool rank0 = false;
  for (int64_t d = from, node = 0; d < seq.numel(); ++d) {
    if (start[node] == start[node + 1]) return 1;  // past the template's depth
    int64_t found = -1;
    for (int64_t i = start[node]; i < start[node + 1] && found < 0; ++i)
      if (tok[kid[i]] == next[d]) found = kid[i];
    if (found < 0) return 0;
    rank0 = found == kid[start[node]];
    node = found;
  }
  return rank0 ? 1 : 0;
}

}  // namespace specbench::host

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  // no tensor argument to dispatch on: one kernel for every caller
  m.def("choose_nodes(float[] p, int[] parents, float[] step_times, float min_gain, int? max_nodes) -> int[]",
        &specbench::host::choose_nodes);
  m.def("template_probabilities(Tensor conf, Tensor node_cells, Tensor parents, int bins, int group, int[] agreed, "
        "int agreed_offset, Tensor trials, Tensor hits, Tensor prior, float weight, float prior_steps, Tensor pools, "
        "Tensor pool_trials, Tensor pool_hits, Tensor pool_prior, float pool_weight) -> (Tensor, float[])",
        &specbench::host::template_probabilities);
  m.def("learn_counterfactual(Tensor tokens, Tensor seq, int from, int length, Tensor kid_start, Tensor kids, Tensor cells, "
        "Tensor(a!) trials, Tensor(b!) hits, float weight, Tensor pools, Tensor(c!) pool_trials, Tensor(d!) pool_hits, "
        "float pool_weight) -> int", &specbench::host::learn_counterfactual);
  m.def("template_bucket(Tensor tokens, Tensor seq, int from, Tensor kid_start, Tensor kids) -> int",
        &specbench::host::template_bucket);
}
