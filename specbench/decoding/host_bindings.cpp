// The host kernels as a Python module of their own (packed_linear.py's `host_kernels()`), beside the torch ops
// the other files register: the same C++ functions, called without torch's dispatcher. A call through
// torch.ops unpacks its arguments against the op's schema, boxes them and walks the dispatch keys before the
// kernel starts; after a CPU forward has swept the caches that path costs some 30 microseconds a call, and a
// drafter makes half a dozen calls a step. pybind11's direct call costs a few.
#include <torch/extension.h>

#include "host_kernels.h"

namespace h = specbench::host;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("row_summary", &h::row_summary);
  m.def("coupling_tables", &h::coupling_tables);
  m.def("write_rows", &h::write_rows);
  m.def("expand_template", &h::expand_template);
  m.def("expand_coupled", [](const at::Tensor& matrix, const at::Tensor& probs, const at::Tensor& neg_log_p,
                             const at::Tensor& log_tail, const std::vector<at::Tensor>& noise, const at::Tensor& parent,
                             const at::Tensor& rank, const at::Tensor& depth, int64_t root) {
    return h::expand_coupled(matrix, probs, neg_log_p, log_tail, noise, parent, rank, depth, root);
  });
  m.def("expand_coupled_keyed", [](const at::Tensor& matrix, const at::Tensor& probs, const at::Tensor& neg_log_p,
                                   const at::Tensor& log_tail, int64_t key, const std::vector<int64_t>& positions,
                                   const at::Tensor& table, const at::Tensor& parent, const at::Tensor& rank,
                                   const at::Tensor& depth, int64_t root) {
    return h::expand_coupled_keyed(matrix, probs, neg_log_p, log_tail, key, positions, table, parent, rank, depth, root);
  });
  m.def("choose_nodes", [](const std::vector<double>& p, const std::vector<int64_t>& parents,
                           const std::vector<double>& step_times, double min_gain, c10::optional<int64_t> max_nodes) {
    return h::choose_nodes(p, parents, step_times, min_gain, max_nodes);
  });
  m.def("template_probabilities", [](const at::Tensor& conf, const at::Tensor& node_cells, const at::Tensor& parents,
                                     int64_t bins, int64_t group, const std::vector<int64_t>& agreed,
                                     int64_t agreed_offset, const at::Tensor& trials, const at::Tensor& hits,
                                     const at::Tensor& prior, double weight, double prior_steps,
                                     const at::Tensor& pools, const at::Tensor& pool_trials,
                                     const at::Tensor& pool_hits, const at::Tensor& pool_prior, double pool_weight) {
    return h::template_probabilities(conf, node_cells, parents, bins, group, agreed, agreed_offset, trials, hits,
                                     prior, weight, prior_steps, pools, pool_trials, pool_hits, pool_prior,
                                     pool_weight);
  });
  m.def("learn_counterfactual", &h::learn_counterfactual);
  // The two kernels a TR chooser calls every step with a dozen tensors that live as long as it does (its rate
  // table's counts and prior, its template's cells, parents and children): bound to them once, a call converts
  // only the step's own arguments. After a CPU forward has swept the caches each conversion costs again.
  m.def("bind_template_probabilities", [](at::Tensor node_cells, at::Tensor parents, int64_t bins, at::Tensor trials,
                                          at::Tensor hits, at::Tensor prior, double prior_steps, at::Tensor pools,
                                          at::Tensor pool_trials, at::Tensor pool_hits, at::Tensor pool_prior) {
    return pybind11::cpp_function([=](const at::Tensor& conf, int64_t group, const std::vector<int64_t>& agreed,
                                      int64_t agreed_offset, double weight, double pool_weight) {
      return h::template_probabilities(conf, node_cells, parents, bins, group, agreed, agreed_offset, trials, hits,
                                       prior, weight, prior_steps, pools, pool_trials, pool_hits, pool_prior,
                                       pool_weight);
    });
  });
  m.def("bind_learn_counterfactual", [](at::Tensor kid_start, at::Tensor kids, at::Tensor trials, at::Tensor hits,
                                        at::Tensor pools, at::Tensor pool_trials, at::Tensor pool_hits) {
    return pybind11::cpp_function([=](const at::Tensor& tokens, const at::Tensor& seq, int64_t from, int64_t length,
                                      const at::Tensor& cells, double weight, double pool_weight) {
      return h::learn_counterfactual(tokens, seq, from, length, kid_start, kids, cells, trials, hits, weight, pools,
                                     pool_trials, pool_hits, pool_weight);
    });
  });
  m.def("template_bucket", &h::template_bucket);
  m.def("sample_keyed", [](const at::Tensor& scores, int64_t key, const std::vector<int64_t>& positions,
                           const at::Tensor& table, const at::Tensor& low, const at::Tensor& high) {
    return h::sample_keyed(scores, key, positions, table, low, high);
  });
  m.def("find_ngram", &h::find_ngram);
}
