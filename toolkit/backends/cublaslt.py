"""GEMMs through cuBLASLt (nvmath-python's bindings), with the algorithm for each decode shape measured once.

cublasGemmEx takes whatever its heuristic ranks first. For the skinny GEMMs of a decode step (a few to a few
hundred token rows against a weight matrix streamed from DRAM) that choice is often not the fastest: the
heuristic models compute, while these GEMMs are bound by how many weight bytes are in flight. So for the row
counts that decode steps replay from CUDA graphs (`tuned_rows`) the plan asks the heuristic for its
`CANDIDATES` best algorithms, times each on the real operands with a cold L2 (a write of an L2-sized buffer
before every timed call, as the weights of a real step come from DRAM), and keeps the fastest; every other
shape (prefill) takes the heuristic's first choice, which is what cublasGemmEx would run. A plan is made the
first time a shape is seen, always outside stream capture (the runner runs every graph's step once eagerly
before capturing it), and reused from then on, also inside captured graphs: `cublasLtMatmul` with our stream,
a preallocated workspace and host scalars can be captured.

nvmath-python's own `Matmul.autotune` does this for its operands, but it cannot take our bf16 weights: CuPy has
no bfloat16 dtype (bf16 arrays are uint16 here). Plans live per process in `_PLANS`, so two engines in one
process run the same algorithm for the same shape (their tokens can be compared bit for bit); a new process may
measure its way to a different algorithm.
"""
import numpy as np

_R_32F, _COMPUTE_32F = 0, 68  # library_types.h / cublas_api.h: fp32 scale, fp32 accumulation (no TF32)
CANDIDATES = 16  # how many of the heuristic's algorithms a tuned shape times
_REPEATS = 7  # timed calls per candidate (the median counts)
_MARGIN = 0.97  # another algorithm replaces the heuristic's first only if it is at least 3% faster
_PLANS = {}  # (device, shape and types, tune) -> _Plan; shared by every LtGemm of the process


def tuned_rows(n: int) -> bool:
    """The token-row counts whose plan is measured: the decode graph buckets (1, 2, 4, ..., 256)."""
    return 1 <= n <= 256 and n & (n - 1) == 0


class _Plan:
    def __init__(self, desc, layouts, results, algos: list, index: int = 0, times_us=()):
        self.desc, self.layouts = desc, layouts
        self.results, self.algos = results, algos  # the heuristic's results (kept alive) and their algo pointers
        self.index, self.algo = index, algos[index]  # the one that runs
        self.times_us = times_us  # median us of each candidate when measured (the benchmark reports them)


class LtGemm:
    """Same call as cublasGemmEx (column-major, C = op(A) op(B)); `tune` picks measured plans for decode shapes."""
    capturable = True

    def __init__(self, cp, stream, workspace_bytes: int):
        from nvmath.bindings import cublasLt

        self.lt, self.cp, self.stream = cublasLt, cp, stream
        self.handle = cublasLt.create()
        self._ws = cp.empty(workspace_bytes, dtype=cp.uint8)
        self._one, self._zero = np.ones(1, np.float32), np.zeros(1, np.float32)  # host scalars (pointer mode host)
        self._flush = None  # L2-sized buffer written before each timed call
        self._device = cp.cuda.Device().id
        self.tune = True

    def __call__(self, transa, transb, m, n, k, a, atype, lda, b, btype, ldb, c, ctype, ldc):
        tune = self.tune and tuned_rows(n)
        key = (self._device, transa, transb, m, n, k, atype, lda, btype, ldb, ctype, ldc, tune)
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = self._plan(key[1:-1], tune, a, b, c)
        self._run(plan, a, b, c)

    def plan_for(self, transa, transb, m, n, k, atype, lda, btype, ldb, ctype, ldc, tune: bool):
        return _PLANS.get((self._device, transa, transb, m, n, k, atype, lda, btype, ldb, ctype, ldc, tune))

    def _run(self, plan, a, b, c, algo=None):
        la, lb, lc = plan.layouts
        self.lt.matmul(self.handle, plan.desc, self._one.ctypes.data, a, la, b, lb, self._zero.ctypes.data, c, lc,
                       c, lc, plan.algo if algo is None else algo, self._ws.data.ptr, self._ws.nbytes,
                       self.stream.ptr)

    def _set(self, setter, dtype_of, obj, attr, value):
        v = np.array(value, dtype=dtype_of(attr))
        setter(obj, attr, v.ctypes.data, v.itemsize)

    def _plan(self, shape, tune: bool, a, b, c) -> _Plan:
        lt = self.lt
        transa, transb, m, n, k, atype, lda, btype, ldb, ctype, ldc = shape
        desc = lt.matmul_desc_create(_COMPUTE_32F, _R_32F)
        for attr, v in ((lt.MatmulDescAttribute.TRANSA, transa), (lt.MatmulDescAttribute.TRANSB, transb)):
            self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, attr, v)
        layouts = (lt.matrix_layout_create(atype, k if transa else m, m if transa else k, lda),
                   lt.matrix_layout_create(btype, n if transb else k, k if transb else n, ldb),
                   lt.matrix_layout_create(ctype, m, n, ldc))
        pref = lt.matmul_preference_create()
        P = lt.MatmulPreferenceAttribute
        for attr, v in ((P.MAX_WORKSPACE_BYTES, self._ws.nbytes),
                        # Split-K only with a separate reduction pass, never in place: the in-place scheme adds the
                        # partial sums into the output in whatever order they finish, so the bits would vary.
                        (P.REDUCTION_SCHEME_MASK, int(lt.ReductionScheme.COMPUTE_TYPE | lt.ReductionScheme.OUTPUT_TYPE))):
            self._set(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref, attr, v)
        want = CANDIDATES if tune else 1
        results, count = lt.MatmulHeuristicResult(want), np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, desc, *layouts, layouts[2], pref, want, results.ptr,
                                     count.ctypes.data)
        lt.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise RuntimeError(f"cuBLASLt has no algorithm for the GEMM {shape}")
        size = np.dtype(lt.matmul_heuristic_result_dtype).itemsize  # the algo struct is each result's first field
        plan = _Plan(desc, layouts, results, [results.ptr + i * size for i in range(int(count[0]))])
        return self._measure(plan, a, b, c) if tune and len(plan.algos) > 1 else plan

    def _measure(self, plan, a, b, c) -> _Plan:
        """Time each candidate on the real operands with a cold L2; keep the heuristic's first unless another is
        clearly faster (so noise does not swap algorithms)."""
        cp = self.cp
        if self._flush is None:
            l2 = cp.cuda.runtime.getDeviceProperties(self._device)["l2CacheSize"]
            with self.stream:
                self._flush = cp.empty(2 * l2, dtype=cp.uint8)
            self.stream.use()
        algos = []
        for algo in plan.algos:  # warm up (loads each algorithm's kernels); drop any the library refuses to run
            try:
                self._run(plan, a, b, c, algo)
                algos.append(algo)
            except self.lt.cuBLASLtError:
                pass
        plan = _Plan(plan.desc, plan.layouts, plan.results, algos)
        count = len(algos)
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(count * _REPEATS)]
        for r in range(_REPEATS):
            for i in range(count):
                cp.cuda.runtime.memsetAsync(self._flush.data.ptr, r & 1, self._flush.nbytes, self.stream.ptr)
                start, stop = events[r * count + i]
                start.record(self.stream)
                self._run(plan, a, b, c, plan.algos[i])
                stop.record(self.stream)
        self.stream.synchronize()
        times = [float(np.median([cp.cuda.get_elapsed_time(*events[r * count + i]) for r in range(_REPEATS)]))
                 for i in range(count)]
        best = int(np.argmin(times))
        index = best if times[best] < _MARGIN * times[0] else 0
        tuned = _Plan(plan.desc, plan.layouts, plan.results, plan.algos, index, tuple(t * 1e3 for t in times))
        self._run(tuned, a, b, c)  # the caller's output, by the chosen algorithm
        return tuned
