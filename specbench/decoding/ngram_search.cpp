// specbench::find_ngram(seq, max_ngram_size, num_pred_tokens) -> (start, n): Prompt Lookup's search
// (drafting/ngram.py's `find_match`, which says what it means) over a 1-D int64 CPU sequence: the
// earliest admissible occurrence of its last n tokens, n from max_ngram_size down to 1; `start` is the
// first token after the match, (-1, 0) when nothing matches.
//
// Why a kernel of our own: the search runs every step of `pld` and `tr_fused`, over the whole context. In
// numpy it is about fifteen array calls of a few microseconds each, however early the match; here a
// scan that stops at the first hit.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "host_kernels.h"

#include <algorithm>
#include <tuple>

namespace specbench::host {

std::tuple<int64_t, int64_t> find_ngram(const at::Tensor& seq, int64_t max_ngram_size, int64_t num_pred_tokens) {
  TORCH_CHECK(seq.dim() == 1 && seq.scalar_type() == at::kLong && seq.device().is_cpu(),
              "find_ngram takes a 1-D int64 CPU tensor");
  const at::Tensor s = seq.contiguous();
  const int64_t* ids = s.data_ptr<int64_t>();
  const int64_t length = s.numel();
  for (int64_t n = std::min(max_ngram_size, length - 1); n > 0; --n) {
    const int64_t last = std::min(length - n - num_pred_tokens, length - 2 * n - 1);  // last admissible window
    const int64_t* query = ids + length - n;
    for (int64_t i = 0; i <= last; ++i) {
      int64_t j = 0;
      while (j < n && ids[i + j] == query[j]) ++j;
      if (j == n) return {i + n, n};
    }
  }
  return {-1, 0};
}

}  // namespace specbench::host

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("find_ngram(Tensor seq, int max_ngram_size, int num_pred_tokens) -> (int, int)");
}
TORCH_LIBRARY_IMPL(specbench, CPU, m) { m.impl("find_ngram", &specbench::host::find_ngram); }
