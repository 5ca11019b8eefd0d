"""Position-keyed sampling: the target's token at absolute position p is

    argmax(filter(logits / T) + gumbel(seed, question, turn, p))

with Gumbel noise from a counter-based hash, so the draw depends on the position alone, not on
which step or which tree node asks for it. AR and any tree verifier that accepts a child exactly
when it equals the sample at its parent therefore emit the same tokens (the one-hot case of
SpecInfer's multi-draft rule), and the output is distributed exactly as the target's.

All nodes at one depth share a position and so one noise vector: a step needs (depth + 1)
vocabulary-sized draws, made in one batched call on the model's device.

On a CPU, where our kernels build, no row is drawn whole: the uniform's 24 bits index a table of every
noise value (`gumbel_table`, the same floats), and `specbench::sample_keyed` (keyed_sampling.cpp) finds
the row's winner from the hash and the table's per-run bounds, adding the exact noise only where it
can win; TR's coupled drafts read the noise entry by entry the same way (`KeyedNoise`).
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch

from specbench.decoding.transfers import on_host, to_device
from specbench.decoding.verify import row_argmax
from specbench.decoding.packed_linear import host_kernels

_M32 = 0xFFFFFFFF
KEPT_NOISE_ROWS = 64  # a deep tree's positions and a few behind them; 64 x a 150k vocabulary: 38 MB


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for uint32 values held in int64, without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser: a bijective avalanche mix of 32-bit values."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def stream_key(seed: int, question_id, turn: int) -> int:
    """A 32-bit key for one (seed, question, turn) stream."""
    digest = hashlib.blake2b(f"{seed}|{question_id}|{turn}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def position_uniforms(key: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniforms in (0, 1), shape (len(positions), vocab), a pure function of (key, position, index)."""
    dev = positions.device
    p = _fmix32((positions.to(torch.int64) * 2 + 1) & _M32) ^ key
    row = _fmix32(_fmix32(p & _M32))
    idx = _mul32(torch.arange(vocab, device=dev, dtype=torch.int64), 0x9E3779B1)
    return _uniforms(_fmix32(_fmix32(row[:, None] ^ idx[None, :])))


def _uniforms(h: torch.Tensor) -> torch.Tensor:
    return ((h >> 8).to(torch.float64) + 0.5) / float(1 << 24)


def _gumbel(u: torch.Tensor, dtype) -> torch.Tensor:
    return (-torch.log(-torch.log(u))).to(dtype)


def gumbel_noise(key: int, positions: torch.Tensor, vocab: int, dtype=torch.float32) -> torch.Tensor:
    return _gumbel(position_uniforms(key, positions, vocab), dtype)


INDEX_BITS = 24  # the uniform's bits: (h >> 8) of a 32-bit hash
RUN_BITS = 12  # `gumbel_table`'s bounds per run of 2**12 indices: 4,096 runs, 16 KB each, in L1
KERNEL_ENV = "SPECBENCH_SAMPLING_KERNEL"  # "off": every noise row drawn whole, as on an accelerator


@functools.cache
def gumbel_table() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(table, low, high): the noise for each of the 2**24 uniforms the hash gives, made by `_gumbel`
    itself (the same floats as a drawn row's; 64 MB, a fraction of a second, once per process), and
    each run of 2**RUN_BITS indices' least and greatest value."""
    n, chunk = 1 << INDEX_BITS, 1 << 20
    table = torch.empty(n, dtype=torch.float32)
    for start in range(0, n, chunk):  # in chunks: the float64 temporaries stay small
        k = torch.arange(start, start + chunk, dtype=torch.int64)
        table[start : start + chunk] = _gumbel(_uniforms(k << 8), torch.float32)
    runs = table.view(-1, 1 << (INDEX_BITS - RUN_BITS))
    return table, runs.amin(dim=1).contiguous(), runs.amax(dim=1).contiguous()


def keyed_kernel_ready() -> bool:
    """Whether this process samples on the host through `specbench::sample_keyed` (our CPU kernels
    built: the first call builds them; SPECBENCH_SAMPLING_KERNEL=off draws whole rows instead)."""
    if os.environ.get(KERNEL_ENV, "").lower() == "off":
        return False
    from specbench.decoding import packed_linear

    return packed_linear.available() and packed_linear.build_problem() is None


@dataclass(frozen=True)
class KeyedNoise:
    """The sampler's stream noise at a few positions, read entry by entry (`expand_coupled_keyed`, with
    the sampler's key) or, on numpy's path, as whole rows the sampler draws."""

    positions: tuple[int, ...]
    sampler: "PositionSampler"

    def rows(self, vocab: int) -> list[np.ndarray]:
        return [self.sampler.noise_row(p, vocab) for p in self.positions]


def _fmix32_host(h):
    """_fmix32 on numpy uint32 values (arrays or scalars), whose products wrap mod 2**32 natively."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


class HostNoise:
    """gumbel_noise for one position at a time on the CPU, bit for bit. The hash runs in numpy's uint32,
    whose products wrap as the hash needs, instead of torch's int64 masked after every product: the
    noise is drawn once per new position, so its cost lands on every sampled token, AR's included
    (scripts/bench_sampling.py times both). The index term is kept per vocabulary size."""

    def __init__(self):
        self._index: dict[int, np.ndarray] = {}

    def __call__(self, key: int, position: int, vocab: int, dtype=torch.float32) -> torch.Tensor:
        idx = self._index.get(vocab)
        if idx is None:
            idx = self._index[vocab] = np.arange(vocab, dtype=np.uint32) * np.uint32(0x9E3779B1)
        with np.errstate(over="ignore"):  # uint32 scalar products warn on wrapping; wrapping is the point
            p = _fmix32_host(np.uint32((position * 2 + 1) & _M32)) ^ np.uint32(key)
            h = _fmix32_host(_fmix32_host(idx ^ _fmix32_host(_fmix32_host(p))))
        u = ((h >> np.uint32(8)).astype(np.float64) + 0.5) / float(1 << 24)  # _uniforms, exact either way
        return _gumbel(torch.from_numpy(u), dtype)


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as transformers' logits processors apply them."""
    scores = logits.float() / temperature
    if top_k and top_k > 0:
        k = min(top_k, scores.shape[-1])
        kth = scores.topk(k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


class PositionSampler:
    """The target's choice at each row when sampling; `bind` fixes the (question, turn) stream."""

    def __init__(self, temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int = 0):
        if temperature <= 0:
            raise ValueError("PositionSampler needs temperature > 0; temperature=0 is greedy decoding")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or positive, got {top_k}")
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.key = stream_key(seed, "", 0)
        # Noise rows by position: a tree verifies positions that the next step verifies again (all
        # but the accepted ones), so each is drawn once, not once per step that reaches it. The hash
        # costs about what a forward row does on a CPU; drawn afresh, a deep tree paid it per depth.
        self._rows: dict[int, torch.Tensor] = {}
        self._rows_of: tuple | None = None
        self._host_noise = HostNoise()
        self._keyed: bool | None = None  # sample_keyed on the host: decided at the first host call

    def prepare(self, device) -> None:
        """Build what host sampling needs (our kernels, the noise table) before anything is timed."""
        if torch.device(device).type == "cpu":
            self.keyed()

    def keyed(self) -> bool:
        """Whether host rows are sampled by `specbench::sample_keyed` (and `KeyedNoise` read entry by
        entry); builds the table the first time."""
        if self._keyed is None:
            self._keyed = keyed_kernel_ready()
            if self._keyed:
                gumbel_table()
        return self._keyed

    def bind(self, question_id, turn: int) -> None:
        self.key = stream_key(self.seed, question_id, turn)

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """logits (rows, vocab), positions (rows,): one noise draw per distinct position. The
        samples stay on the logits' device (the engine copies back only the accepted path). Positions
        on the host (the engine's) are grouped there, so nothing is read back from the device."""
        scores = filter_logits(logits, self.temperature, self.top_k, self.top_p)  # a new tensor
        dev = logits.device
        if positions.device.type == "cpu":
            at = positions.reshape(-1).tolist()
            if on_host(dev) and scores.dim() == 2 and self.keyed():  # a SyncAudit's stand-in: the device's path
                return host_kernels().sample_keyed(scores, self.key, at, *gumbel_table())
            vocab = scores.shape[-1]
            uniq = sorted(set(at))
            rows = dict(zip(uniq, self._noise(uniq, vocab, dev)))
            start = 0  # a tree's rows come depth by depth: one in-place add per run of one position
            for end in range(1, len(at) + 1):
                if end == len(at) or at[end] != at[start]:
                    scores[start:end] += rows[at[start]]
                    start = end
            return row_argmax(scores)
        # positions on the device: reading them back would cost a sync, so no reuse
        uniq, inverse = torch.unique(positions, return_inverse=True)
        noise = gumbel_noise(self.key, uniq, scores.shape[-1])
        return (scores + noise[to_device(inverse, dev)]).argmax(dim=-1)

    def noise_row(self, position: int, vocab: int) -> np.ndarray:
        """The stream's noise at one position on the host, a view of the row the verifier adds there
        (drawn once for both: tr/adaptive.py's coupled drafts read it before the verifier does)."""
        return self._noise([position], vocab, "cpu")[0].numpy()

    def keyed_noise(self, positions: list[int]) -> KeyedNoise:
        """The stream's noise at `positions` as coupled drafts read it (tr/adaptive.py)."""
        return KeyedNoise(tuple(positions), self)

    def noise_rows(self, positions: list[int], vocab: int, device) -> torch.Tensor:
        """(len(positions), vocab): the stream's Gumbel noise at each position, equal to
        gumbel_noise(self.key, positions, vocab); a row drawn for an earlier call is reused."""
        return torch.stack(self._noise(positions, vocab, device))

    def _noise(self, positions: list[int], vocab: int, device) -> list[torch.Tensor]:
        if self._rows_of != (self.key, vocab, torch.device(device)):
            self._rows, self._rows_of = {}, (self.key, vocab, torch.device(device))
        missing = [p for p in positions if p not in self._rows]
        if missing:
            on_host = self._rows_of[2].type == "cpu"
            for p in missing:  # one at a time: several at once spill the hash's temporaries out of cache
                if on_host:
                    self._rows[p] = self._host_noise(self.key, p, vocab)
                else:
                    self._rows[p] = gumbel_noise(self.key, to_device(torch.tensor([p]), device), vocab)[0]
            wanted = set(positions)
            for p in sorted(self._rows)[: max(0, len(self._rows) - KEPT_NOISE_ROWS)]:
                if p not in wanted:  # the earliest positions go: a turn moves forward
                    del self._rows[p]
        return [self._rows[p] for p in positions]
