"""NumPy references for the sampler's CPU twin (kernels/sampler.py), used by the tests only: vectorised
Philox4x32-10 and the Gumbel noise of any token ids, and a float64 softmax."""
import numpy as np

from kernels.sampler import M0, M1, W0, W1

_U32 = np.uint64(0xFFFFFFFF)
_INV23 = np.float32(2.0 ** -23)


def philox4x32_10(counter, key) -> np.ndarray:
    """Vectorised Philox4x32-10: counter uint32[..., 4], key uint32[..., 2] (broadcast) -> uint32[..., 4]."""
    c = [np.asarray(counter, np.uint64)[..., i] for i in range(4)]
    k0, k1 = (np.asarray(key, np.uint64)[..., i] for i in range(2))
    for _ in range(10):
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _U32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _U32]
        k0, k1 = (k0 + np.uint64(W0)) & _U32, (k1 + np.uint64(W1)) & _U32
    return np.stack(np.broadcast_arrays(*c), axis=-1).astype(np.uint32)


def uniform_from_word(w) -> np.ndarray:
    return ((np.asarray(w, np.uint32) >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) * _INV23


def noise_words(seed: int, pos: int, tokens) -> np.ndarray:
    """uint32 Philox word of each token id (vectorised NumPy): coarse byte on top of the fine word (kernels/sampler.py's docstring)."""
    v = np.asarray(tokens, np.int64)
    key = np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], np.uint64)

    def word(counter0, counter2, q):
        ctr = np.zeros(v.shape + (4,), np.uint64)
        ctr[..., 0], ctr[..., 1], ctr[..., 2] = counter0, np.uint32(pos & 0xFFFFFFFF), counter2
        return np.take_along_axis(philox4x32_10(ctr, key), q[..., None], axis=-1)[..., 0].astype(np.uint64)
    coarse, fine = word(v >> 4, 1, (v >> 2) & 3), word(v >> 2, 0, v & 3)
    byte = (coarse >> (np.uint64(8) * (v & 3).astype(np.uint64))) & np.uint64(0xFF)
    return ((byte << np.uint64(24)) | (fine >> np.uint64(8))).astype(np.uint32)


def gumbel_noise(seed: int, pos: int, tokens) -> np.ndarray:
    """float32 noise g(seed, pos, v) for the given token ids (vectorised NumPy; the reference for the kernel)."""
    return gumbel_from_uniform(uniform_from_word(noise_words(seed, pos, tokens)))


def gumbel_from_uniform(u) -> np.ndarray:
    """g = -log(-log1p(-u)), each step rounded to fp32 (as logf / log1pf do on the GPU, up to their last ulp)."""
    t = (-np.log1p(-np.asarray(u, np.float64))).astype(np.float32)
    return (-np.log(t.astype(np.float64))).astype(np.float32)


def softmax_rows(x) -> np.ndarray:
    """float64 softmax of each row of x [R, V] (-inf -> probability 0)."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
