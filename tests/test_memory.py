"""What a turn's memory figures count (specbench/run/memory.py): the KV cache by its tensors' storages,
a drafter's state by what it holds and not what it shares with the target."""

import sys

import numpy as np
import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.methods.ar import Autoregressive
from specbench.run import memory


def test_tensors_count_their_storage_once_and_arrays_their_owner():
    t = torch.zeros(1000)  # 4000 bytes
    assert memory.state_bytes({"a": t, "b": t[:10], "c": [t[5:]]}, python_objects=False) == 4000
    a = np.zeros(100, dtype=np.int64)  # 800 bytes
    assert memory.state_bytes([a[:3], a[50:]], python_objects=False) == 800
    assert memory.state_bytes([torch.zeros(2), np.zeros(2)], python_objects=False) == 8 + 16


def test_memory_mapped_arrays_are_left_out(tmp_path):
    np.arange(1000, dtype=np.int64).tofile(tmp_path / "tokens.bin")
    mapped = np.memmap(tmp_path / "tokens.bin", dtype=np.int64, mode="r")
    assert memory.state_bytes({"tokens": mapped, "view": mapped[10:]}, python_objects=False) == 0


def test_python_objects_are_estimated_once_through_cycles():
    class Node:
        def __init__(self):
            self.children = {}

    root, leaf = Node(), Node()
    root.children[7] = leaf
    leaf.children[0] = root  # a cycle: walked once
    got = memory.state_bytes(root)
    parts = [root, leaf, root.children, leaf.children, 7, 0]
    assert got == sum(sys.getsizeof(o) for o in parts)
    assert memory.state_bytes(root, python_objects=False) == 0


def test_slots_and_what_is_code_or_class():
    class Slotted:
        __slots__ = ("buf", "fn")

        def __init__(self):
            self.buf, self.fn = torch.zeros(4), print

    assert memory.state_bytes(Slotted(), python_objects=False) == 16


def test_a_drafter_is_not_charged_for_the_targets_weights(tiny_llama):
    class Borrowing:  # as EAGLE holds the target's embedding and SpS its cut-short layers
        def __init__(self, model):
            self.embed = model.get_input_embeddings()
            self.layer = model.model.layers[0]
            self.own = torch.zeros(25)

    d = Borrowing(tiny_llama)
    shared = memory.target_parts(tiny_llama)
    assert memory.state_bytes(d, python_objects=False, skip=shared) == 100
    assert memory.state_bytes(d, python_objects=False) > 97 * 32 * 4  # unskipped: the embedding counts
    assert memory.target_parts(None) == (set(), set())


def test_kv_cache_bytes_of_a_turn(tiny_llama):
    """Two layers, keys and values, 2 KV heads of 8 dims in float32 over every position but the last
    token's (which is emitted, never fed)."""
    prompt = list(range(1, 21))
    out = Engine(tiny_llama, eos_token_ids=[]).generate(prompt, Autoregressive(), 8,
                                                        measure_cache=memory.kv_cache_bytes)
    assert out.kv_cache_bytes == 2 * 2 * (2 * (20 + 8 - 1) * 8) * 4
    assert Engine(tiny_llama, eos_token_ids=[]).generate(prompt, Autoregressive(), 8).kv_cache_bytes is None


def test_turn_memory_off_cuda():
    got = memory.turn_memory(123, {"x": torch.zeros(2)}, "cpu", memory.target_parts(None))
    assert got["kv_cache_bytes"] == 123 and got["drafter_state_bytes"] >= 8 and "peak_device_bytes" not in got
    memory.start_turn("cpu")  # nothing to reset off CUDA
    assert memory.peak_device_bytes("cpu") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_peak_device_bytes_restart_per_turn():
    big = torch.empty(64 * 2 ** 20, dtype=torch.uint8, device="cuda")
    del big  # the earlier turn's peak
    memory.start_turn("cuda")
    before = torch.cuda.memory_allocated()
    small = torch.empty(2 ** 20, dtype=torch.uint8, device="cuda")
    peak = memory.peak_device_bytes("cuda")
    assert before + small.numel() <= peak < before + 64 * 2 ** 20


def test_an_array_over_a_buffer_counts_and_one_over_a_mapping_does_not(tmp_path):
    import mmap

    assert memory.state_bytes(np.frombuffer(bytes(64), dtype=np.uint8)[8:], python_objects=False) == 64
    (tmp_path / "f").write_bytes(bytes(4096))
    with open(tmp_path / "f", "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        assert memory.state_bytes(np.frombuffer(m, dtype=np.uint8), python_objects=False) == 0
        del m  # the array is gone; the mapping may close
