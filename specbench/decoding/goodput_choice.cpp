// specbench::choose_nodes(p, parents, step_times, min_gain, max_nodes) -> node ids: the goodput chooser's
// sub-tree (speculation/goodput.py's `choose_nodes`, which says what it means) in one call, the same
// choice in the same doubles: p capped by each parent's value, the nodes in decreasing order (ties by
// id), the running sum 1 + p_1 + ... + p_m over t(m + 1), the first best m, taken when it beats the
// plain step by 1 + min_gain.
//
// Why a kernel of our own: TR's adaptive and fused drafters choose every step; in numpy the choice is
// a Python pass over the template, a sort and a few array calls, about 0.05 ms a step of host work.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace {

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  // no tensor argument to dispatch on: one kernel for every caller
  m.def("choose_nodes(float[] p, int[] parents, float[] step_times, float min_gain, int? max_nodes) -> int[]",
        &choose_nodes);
}
