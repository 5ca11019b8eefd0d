// The host kernels' entry points, declared once: each .cpp beside this file defines its own and registers
// them as torch ops (torch.ops.specbench.*, for tests and for callers that want the dispatcher), and
// host_bindings.cpp binds the same functions as a Python module of their own. A drafter calls them every
// step through that module: on a CPU whose caches the forward has just swept, a call through torch's
// dispatcher costs some 30 microseconds before the kernel starts, a direct one a few.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace specbench::host {

// row_summary.cpp
std::tuple<at::Tensor, at::Tensor, at::Tensor> row_summary(const at::Tensor& logits, int64_t k, bool normaliser);
std::tuple<at::Tensor, at::Tensor> coupling_tables(const at::Tensor& probs, double temperature);
at::Tensor write_rows(const at::Tensor& logits, int64_t root, const c10::optional<at::Tensor>& draft_tokens,
                      at::Tensor matrix, at::Tensor written, const c10::optional<at::Tensor>& probs,
                      const c10::optional<at::Tensor>& neg_log_p, const c10::optional<at::Tensor>& log_tail,
                      double temperature);

// tree_expansion.cpp
std::tuple<at::Tensor, at::Tensor> expand_template(const at::Tensor& matrix, const c10::optional<at::Tensor>& probs,
                                                   const at::Tensor& parent, const at::Tensor& rank, int64_t root);
std::tuple<at::Tensor, at::Tensor> expand_coupled(const at::Tensor& matrix, const at::Tensor& probs,
                                                  const at::Tensor& neg_log_p, const at::Tensor& log_tail,
                                                  at::TensorList noise, const at::Tensor& parent,
                                                  const at::Tensor& rank, const at::Tensor& depth, int64_t root);
std::tuple<at::Tensor, at::Tensor> expand_coupled_keyed(const at::Tensor& matrix, const at::Tensor& probs,
                                                        const at::Tensor& neg_log_p, const at::Tensor& log_tail,
                                                        int64_t key, at::ArrayRef<int64_t> positions,
                                                        const at::Tensor& table, const at::Tensor& parent,
                                                        const at::Tensor& rank, const at::Tensor& depth, int64_t root);

// goodput_choice.cpp
std::vector<int64_t> choose_nodes(at::ArrayRef<double> p, at::ArrayRef<int64_t> parents,
                                  at::ArrayRef<double> step_times, double min_gain, c10::optional<int64_t> max_nodes);
std::tuple<at::Tensor, std::vector<double>> template_probabilities(
    const at::Tensor& conf, const at::Tensor& node_cells, const at::Tensor& parents, int64_t bins, int64_t group,
    at::ArrayRef<int64_t> agreed, int64_t agreed_offset, const at::Tensor& trials, const at::Tensor& hits,
    const at::Tensor& prior, double weight, double prior_steps, const at::Tensor& pools,
    const at::Tensor& pool_trials, const at::Tensor& pool_hits, const at::Tensor& pool_prior, double pool_weight);
int64_t learn_counterfactual(const at::Tensor& tokens, const at::Tensor& seq, int64_t from, int64_t length,
                             const at::Tensor& kid_start,
                             const at::Tensor& kids, const at::Tensor& cells, at::Tensor trials, at::Tensor hits,
                             double weight, const at::Tensor& pools, at::Tensor pool_trials, at::Tensor pool_hits,
                             double pool_weight);
int64_t template_bucket(const at::Tensor& tokens, const at::Tensor& seq, int64_t from, const at::Tensor& kid_start,
                        const at::Tensor& kids);

// keyed_sampling.cpp
at::Tensor sample_keyed(const at::Tensor& scores, int64_t key, at::ArrayRef<int64_t> positions,
                        const at::Tensor& table, const at::Tensor& low, const at::Tensor& high);

// ngram_search.cpp
std::tuple<int64_t, int64_t> find_ngram(const at::Tensor& seq, int64_t max_ngram_size, int64_t num_pred_tokens);

}  // namespace specbench::host
