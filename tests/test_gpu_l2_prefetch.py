"""add_rmsnorm's L2 prefetch (kernels/rmsnorm.cu's prefetch_l2, EngineOptions.l2_prefetch) on the GPU: with a
prefetch table of weight ranges (sizes that are and are not whole 64 KB pieces, more pieces than threads and fewer)
the kernel's output and residual are bit for bit those without it, on one row and on 32, and the table holds each
array's address and size. Skipped without a GPU (the prefetch itself needs Hopper; before it the table is ignored)."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
from gpu_arrays import dev  # noqa: E402
from test_gpu_kernels import K  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_prefetch_changes_no_bit(rows):
    k = K("bfloat16")
    rng = np.random.default_rng(rows)
    H = 896
    # Weight-like arrays: 17.4 MB (gate_up at Qwen2.5-0.5B), 8.7 MB, and sizes that are no whole 64 KB piece.
    arrays = [cp.zeros((9728, 896), cp.uint16), cp.zeros((896, 4864), cp.uint16), cp.zeros(1000, cp.uint16),
              cp.zeros(8, cp.uint16)]
    table = k.prefetch_table(arrays)
    got = cp.asnumpy(table)
    assert got.dtype == np.uint64 and got.shape == (4, 2)
    assert [tuple(r) for r in got] == [(a.data.ptr, a.nbytes) for a in arrays]
    x, w = rng.standard_normal((rows, H)), rng.standard_normal(H)
    outs = []
    for pf in (None, table):
        h, out = dev(np.tile(np.arange(H) / H, (rows, 1)), "bfloat16"), dev(np.zeros((rows, H)), "bfloat16")
        k.add_rmsnorm(dev(x, "bfloat16"), h, dev(w, "bfloat16"), 1e-6, out, pf)
        outs.append((cp.asnumpy(h), cp.asnumpy(out)))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
