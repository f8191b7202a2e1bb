"""Drawing one token: argmax, inverse CDF, and the noise of seeded rows (pure tensor
functions shared by verification and `draft/sampler.py`, so both sides draw alike).

A seeded sampled request's output token i takes vLLM's own noise for that token: on
CPU the i-th seed of the request's generator stream (`SeedStream`), through vLLM's
fused Gumbel-max op (`compat/seeded.py`), so its text is vLLM's without speculation.
Where vLLM has no such op (its CUDA wheels), the token at absolute position t is
first_argmax(p_t / E_t) with E_t [V] i.i.d. Exp(1) noise keyed by (seed, t) alone
(`position_noise`): a sample from p_t, the same whatever was drafted, but not vLLM's.
Either way the draft drafts with the same noise on q, and agrees whenever the noisy
argmax picks the same token under q and p (references: the `rejection.py` docstring).
"""

from __future__ import annotations

import torch

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
# Smallest normal float32: p / E stays finite (p <= 1), and a p = 0 token scores 0,
# below any positive p, even when its E would have been 0.
_TINY = torch.finfo(torch.float32).tiny


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the largest value along the last dim (ties: the lowest index), as
    ``torch.argmax``. ``max(dim).indices`` has the same documented tie rule and on CPU
    is 1.5x (float32) to 4.5x (bfloat16) faster than argmax over [288, 49,152] rows."""
    return x.max(dim=-1).indices


def _splitmix64(x: int) -> int:
    """splitmix64's step and finaliser (Steele et al.): a bijection on 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _fmix32(x: int) -> int:
    """murmur3's 32-bit finaliser: a bijection on 32 bits."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def noise_seed(seed: int, position: int) -> int:
    """The 64-bit generator seed of position ``position`` (>= 0) of a request seeded
    with ``seed`` (any int; taken mod 2^64).

    CPU generators (mt19937) keep only the low 32 bits of their seed, so those bits
    are a bijection of the position for a fixed seed: two positions of one request
    never share noise (for t < 2^32). The high 32 bits come from the seed alone and
    separate requests further on generators that use all 64 (CUDA's Philox).
    """
    s = _splitmix64(int(seed) & _M64)
    return (s & (_M64 ^ _M32)) | _fmix32((s + int(position)) & _M32)


def position_noise(seed: int, position: int, vocab: int,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """E_t: [V] float32 i.i.d. Exp(1), >= the smallest normal float32, a function of (seed,
    position, V, device type) alone, from a fresh generator on ``device`` (draft and
    target must sample on one device type to agree; exactness never depends on it)."""
    g = torch.Generator(device=device)
    g.manual_seed(noise_seed(seed, position))
    e = torch.empty(vocab, dtype=torch.float32, device=device).exponential_(generator=g)
    return e.clamp_min_(_TINY)


def position_noise_rows(seed: int, start: int, count: int, vocab: int,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """E_start .. E_{start+count-1} of one request: [count, V] float32."""
    out = torch.empty(count, vocab, dtype=torch.float32, device=device)
    for i in range(count):
        out[i] = position_noise(seed, start + i, vocab, device)
    return out


def coupled_token(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """first_argmax(probs / noise) over the last dim: probs [..., V] >= 0 with a
    positive sum, noise [..., V] from ``position_noise``. Returns [...] int64.

    Token i wins with probability probs[i] / sum(probs) (the exponential race,
    equivalent to Gumbel-max); a probs = 0 token never wins.
    """
    return first_argmax(probs.to(torch.float32) / noise)


class SeedStream:
    """One seeded request's noise stream, as vLLM's CPU sampler draws it: output token i
    takes the i-th ``torch.randint(0, 2**31, (1,), generator=g)`` of a generator seeded
    with the request's seed (``TopKTopPSampler.forward_cpu``). Each is drawn once and
    kept, with the generator state before it, until ``release`` passes it, so a position
    re-verified in a later step (its draft rejected before it) gets the same seed, and
    vLLM's generator can be set to draw it (``state_at``)."""

    __slots__ = ("seed", "prompt_len", "_gen", "_seeds", "_states", "_base")

    def __init__(self, seed: int, prompt_len: int) -> None:
        self.seed, self.prompt_len = int(seed), int(prompt_len)
        self._gen = torch.Generator()
        self._gen.manual_seed(self.seed)
        self._seeds: list[int] = []  # the draws for output tokens _base, _base + 1, ...
        self._states: list[torch.Tensor] = []  # the generator state before each
        self._base = 0

    def seeds(self, start: int, count: int) -> list[int]:
        """vLLM's seeds of output tokens start .. start + count - 1 (start >= the last
        ``release``). Drops nothing: a round's later draft passes ask for tokens past
        the ones its verification asks for next."""
        if start < self._base:
            raise ValueError(f"seeds of output token {start} were released "
                             f"(up to {self._base})")
        while self._base + len(self._seeds) < start + count:
            self._states.append(self._gen.get_state())
            self._seeds.append(int(torch.randint(0, 2**31, (1,), generator=self._gen,
                                                 dtype=torch.long).item()))
        i = start - self._base
        return self._seeds[i:i + count]

    def state_at(self, index: int) -> torch.Tensor:
        """The generator state whose next draw is output token ``index``'s seed (index >=
        the last ``release``): what vLLM's generator must hold to sample that token."""
        self.seeds(index, 1)
        return self._states[index - self._base]

    def release(self, done: int) -> None:
        """Forget the seeds of output tokens before ``done`` (emitted: never sampled
        again). Verification calls it with the outputs committed so far."""
        drop = min(max(done - self._base, 0), len(self._seeds))
        del self._seeds[:drop]
        del self._states[:drop]
        self._base += drop

    def noise(self, start: int, count: int, vocab: int,
              device: torch.device | str = "cpu") -> torch.Tensor:
        """The race's noise E_t of output tokens start .. start + count - 1 (absolute
        positions prompt_len + i): [count, V] float32, where vLLM's op is missing."""
        return position_noise_rows(self.seed, self.prompt_len + start, count, vocab, device)


class SeedStreams:
    """The ``SeedStream`` of each live seeded request, by request id (the proposer owns
    one; verification and drafting read the same)."""

    def __init__(self) -> None:
        self._streams: dict[str, SeedStream] = {}

    def get(self, req_id: str, seed: int, prompt_len: int) -> SeedStream:
        stream = self._streams.get(req_id)
        if stream is None:
            stream = self._streams[req_id] = SeedStream(seed, prompt_len)
        return stream

    def forget(self, req_id: str) -> None:
        self._streams.pop(req_id, None)


def sample_from_weights(
    weights: torch.Tensor,  # [..., V] float, >= 0, positive sum per row
    uniform: torch.Tensor,  # [...] float64 in [0, 1)
) -> torch.Tensor:
    """Inverse-CDF sampling ([...] int64): token i with probability weights[i] /
    sum(weights). The float64 cumulative sum makes rounding bias negligible; a zero-weight
    token needs cdf[i-1] <= x < cdf[i] = cdf[i-1], so never comes; the one rounding edge,
    x == total, is clamped to the last positive-weight token."""
    cdf = weights.double().cumsum(dim=-1)
    x = (uniform * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    vocab = weights.shape[-1]
    last_positive = vocab - 1 - (weights > 0).flip(-1).to(torch.uint8).argmax(dim=-1)
    return torch.minimum(index, last_positive)
