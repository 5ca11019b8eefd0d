"""The kernel breakdown: matrix-product shapes from inductor's kernel names and from recorded shapes,
rates by hand, per-step aggregation, and a real profile of the tiny model's eager forward."""

from types import SimpleNamespace

import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.tools.kernel_profile import KernelTime, breakdown_table, gemm_ms, gemm_shape, kernel_times, total_ms


def ev(key, us, count, shapes=None):
    return SimpleNamespace(key=key, self_cpu_time_total=us, count=count, input_shapes=shapes)


def test_gemm_shape_from_template_names_and_recorded_shapes():
    assert gemm_shape("graph_0_gemm_ms27n3072k576_kernel") == (3072, 576)
    assert gemm_shape("graph_1_gemm_m16n960k576_kernel") == (960, 576)  # a static row count
    assert gemm_shape("aten::mm", [[8, 576], [576, 49152]]) == (49152, 576)
    assert gemm_shape("aten::addmm", [[960], [8, 576], [576, 960], [], []]) == (960, 576)
    assert gemm_shape("mkldnn::_linear_pointwise", [[1, 8, 576], [3072, 576], [], [], [], []]) == (3072, 576)
    # our kernel: weight panels [n / 6, k, 6], n padded to the panels' width
    assert gemm_shape("specbench::packed_linear", [[1, 8, 576], [512, 576, 6], [], []]) == (3072, 576)
    assert gemm_shape("aten::mm") is None  # no shapes recorded
    assert gemm_shape("aten::_scaled_dot_product_flash_attention_for_cpu", [[1, 9, 8, 64]]) is None
    assert gemm_shape("graph_0_cpp_fused_add_mean_mul_pow_rsqrt_0") is None


def test_rates_by_hand():
    # 10 calls of a 1000 x 500 float32 product in 2 ms per step: 0.2 ms per call reading 2 MB -> 10 GB/s;
    # 4 rows: 2 x 4 x 5e5 = 4 MFLOP per call -> 20 GFLOP/s
    t = KernelTime("g", ms_per_step=2.0, calls_per_step=10, gemm=(1000, 500))
    gbs, gflops = t.rates(rows=4, itemsize=4)
    assert gbs == pytest.approx(10.0) and gflops == pytest.approx(20.0)
    assert KernelTime("sdpa", 1.0, 30).rates(4, 4) is None


def test_kernel_times_per_step_merged_and_sorted():
    events = [ev("graph_0_gemm_ms27n3072k576_kernel", 9000, 300), ev("aten::sdpa", 3000, 300),
              ev("aten::mm", 500, 10, [[2, 8], [8, 16]]), ev("aten::mm", 1500, 10, [[2, 8], [8, 32]]),
              ev("aten::empty", 0, 50), ev("aten::view", 10, 100)]
    times = kernel_times(events, steps=10)
    assert [t.name for t in times] == ["graph_0_gemm_ms27n3072k576_kernel", "aten::sdpa", "aten::mm",
                                       "aten::mm", "aten::view"]  # zero-time rows dropped
    assert times[0].ms_per_step == pytest.approx(0.9) and times[0].calls_per_step == 30
    assert {t.gemm for t in times if t.name == "aten::mm"} == {(16, 8), (32, 8)}  # one row per shape
    assert total_ms(times) == pytest.approx(1.401) and gemm_ms(times) == pytest.approx(1.1)
    assert [t.name for t in kernel_times(events, 10, min_share=0.05)] == [
        "graph_0_gemm_ms27n3072k576_kernel", "aten::sdpa", "aten::mm"]


def test_breakdown_table_columns_per_width():
    by_rows = {2: [KernelTime("g", 2.0, 10, (1000, 500)), KernelTime("sdpa", 1.0, 30)],
               8: [KernelTime("g", 4.0, 10, (1000, 500)), KernelTime("sdpa", 1.5, 30)]}
    table = breakdown_table(by_rows, itemsize=4).splitlines()
    assert table[0].startswith("| kernel | calls/step | w=2") and "w=8" in table[0]
    # w=2: 0.2 ms per call -> 10 GB/s, 2 x 2 x 5e5 / 2e-4 s = 10 GFLOP/s; w=8: 0.4 ms -> 5 GB/s, 20 GFLOP/s
    assert table[2] == "| g (1000 x 500) | 10 | 2.00 (10.0, 10) | 4.00 (5.0, 20) |"
    assert table[3] == "| sdpa | 30 | 1.00 | 1.50 |"
    assert table[-2] == "| **all matrix products** | | 2.00 | 4.00 |"
    assert table[-1] == "| **everything profiled** | | 3.00 | 5.50 |"


@torch.inference_mode()
def test_real_profile_of_the_tiny_eager_forward(tiny_llama):
    """The tiny Llama's eager step: its projections show up as shaped matrix products (the lm_head's
    97 x 32 among them) and the profiled self times add up to no more than the wall time."""
    from specbench.decoding.kv_cache import compact_kv_cache
    from specbench.speculation.cost import filled_cache_and_drafts

    model = tiny_llama
    eng = Engine(model, [])
    cache, prefix, drafts = filled_cache_and_drafts(model, eng, [4], 20)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            eng.forward_rows(cache, 20, drafts[4], root=int(prefix[-1]))
            compact_kv_cache(cache, 20, [])
    times = kernel_times(prof.key_averages(group_by_input_shape=True), steps=3)
    shapes = {t.gemm for t in times if t.gemm}
    assert (97, 32) in shapes, shapes  # the lm_head
    assert gemm_ms(times) > 0 and total_ms(times) >= gemm_ms(times)
