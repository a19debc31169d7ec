"""cuBLAS with a measured algorithm: the step plan's "tuned" projections (a prompt's GEMMs of hundreds of rows or
more).

cublasGemmEx runs the first algorithm of cuBLAS's heuristic. At prefill sizes another of cuBLASLt's candidates is
often faster: on an H100 (dev/prefill_gemms.py, experiments/NOTEBOOK.md, session 19) Qwen3-0.6B's gate_up
projection at 4,096 and 8,192 rows took 0.82-0.83x gemmEx's time in two runs, the 0.5B's at 4,096 0.87-0.88x
(elsewhere mostly within the 5-10% a GEMM's time moves between runs on that GPU). So the first
call of each (N, K, types, row bucket) times gemmEx and up to CANDIDATES of cuBLASLt's heuristic algorithms on the
call's own operands (each as a CUDA graph of CALLS calls, the graphs replayed in turn for REPEATS rounds), and
keeps a cuBLASLt algorithm only where it is at least 1 - MARGIN faster than gemmEx (noise never swaps
algorithms); later calls of the bucket run that choice. The engine makes those first calls when it starts
(Model.tune, the calls plan.py's tuned_calls lists: 0.4-0.95 s for the bench shapes on an H100), so no request pays
for a measurement.

- Row bucket: the power of two >= the rows. A call with other rows than the measured ones runs the bucket's
  algorithm where cublasLtMatmulAlgoCheck accepts it for its shape and its pointers are as aligned as the
  measured ones (cuBLASLt's kernels may assume the alignment they were chosen under); else gemmEx.
- Never measured inside a stream capture: the runner runs every graph's step once eagerly first, so a graph
  replays a measured choice; a capture that still finds none runs gemmEx, uncached.
- cublasLtMatmul with our stream, the backend's cuBLAS workspace (the two never run at once: one stream) and host
  scalars is capturable, as gemmEx is.
- Split-K candidates reduce out of place (REDUCTION_SCHEME_MASK), in a fixed order: the in-place scheme adds
  slices into the output in whatever order they finish, so its bits would vary from run to run.
- Choices live per process (_CHOICES), shared by every backend in it: two engines of one process run the same
  algorithm for the same shape, so their tokens can be compared bit for bit. Another process may measure its way
  to another choice: the same products, summed in another order.
"""
import numpy as np

_R_32F, _COMPUTE_32F = 0, 68  # library_types.h / cublas_api.h: fp32 scale, fp32 accumulation (no TF32)
_OP_N, _OP_T = 0, 1
CANDIDATES = 8  # how many of cuBLASLt's heuristic algorithms a shape times, besides gemmEx
CALLS, REPEATS = 4, 5  # calls a candidate's graph holds; rounds of the graphs in turn (the median counts)
MARGIN = 0.97  # a cuBLASLt algorithm replaces gemmEx only if it is at least 3% faster
_CHOICES = {}  # (device, N, K, in type, out type, row bucket) -> _Choice, for every TunedGemm of the process
_MAX_SHAPES = 4096  # cached per-rows layouts and checks past which they are dropped (a server's many prompt lengths)


def row_bucket(rows: int) -> int:
    """The power of two >= rows: the rows a measured choice stands for."""
    return 1 << max(0, rows - 1).bit_length()


def alignment(*ptrs) -> int:
    """The largest power of two up to 256 bytes that divides every pointer."""
    a = 256
    for p in ptrs:
        a = min(a, p & -p) if p else a
    return a


class _Choice:
    """What a (shape, row bucket) runs: `algo` None for gemmEx, else a cuBLASLt algorithm (a pointer into `results`,
    kept alive here) measured at `rows` with pointers aligned to `align` bytes. `times_us`: gemmEx's median first,
    then each candidate's that cuBLASLt ran (those it refused are dropped); `config`: the chosen algorithm's (id, tile,
    split-K slices, stages), for reports."""

    def __init__(self, rows, align, algo=None, results=None, times_us=(), config=None):
        self.rows, self.align, self.algo, self.results = rows, align, algo, results
        self.times_us, self.config = times_us, config

    def describe(self) -> str:
        if self.algo is None:
            return "gemmEx"
        return "cuBLASLt algo {} tile {} split-K {} stages {}".format(*self.config)


class TunedGemm:
    """out[T, N] = x[T, K] @ w[N, K].T by the algorithm measured fastest for its (N, K, types, row bucket)."""

    def __init__(self, cp, stream, gemm_ex, workspace, lt=None):
        """gemm_ex: the backend's cublasGemmEx call (its arguments); lt: nvmath.bindings.cublasLt (tests pass a
        stand-in)."""
        if lt is None:
            from nvmath.bindings import cublasLt as lt

        self.lt, self.cp, self.stream, self.gemm_ex = lt, cp, stream, gemm_ex
        self.handle = lt.create()
        self._ws = workspace
        self._one, self._zero = np.ones(1, np.float32), np.zeros(1, np.float32)  # host scalars (pointer mode host)
        self._device = cp.cuda.Device().id
        self._desc = None  # the matmul descriptor: C = op_T(A) op_N(B), fp32 accumulation
        self._layouts, self._fits = {}, {}
        self._check_result = lt.MatmulHeuristicResult(1)

    def _key(self, N, T, K, in_type, out_type) -> tuple:
        return self._device, N, K, in_type, out_type, row_bucket(T)

    def choice(self, N, T, K, in_type, out_type):
        """The measured choice for this shape's row bucket (None before its first eager call)."""
        return _CHOICES.get(self._key(N, T, K, in_type, out_type))

    def __call__(self, N, T, K, w, x, out, in_type, out_type):
        """w, x, out: device pointers of w[N, K], x[T, K], out[T, N] (row-major), types as cudaDataType."""
        key = self._key(N, T, K, in_type, out_type)
        c = _CHOICES.get(key)
        if c is None:
            if self.stream.is_capturing():
                return self._gemm_ex(N, T, K, w, x, out, in_type, out_type)
            c = _CHOICES[key] = self._measure(N, T, K, w, x, out, in_type, out_type)
            return None  # _measure left the chosen algorithm's product in out
        if c.algo is None or alignment(w, x, out) < c.align or not self._accepts(c, N, T, K, in_type, out_type):
            return self._gemm_ex(N, T, K, w, x, out, in_type, out_type)
        return self._run(c.algo, N, T, K, w, x, out, in_type, out_type)

    # -- cuBLASLt ------------------------------------------------------------------------------------------
    def _gemm_ex(self, N, T, K, w, x, out, in_type, out_type):
        self.gemm_ex(_OP_T, _OP_N, N, T, K, w, in_type, K, x, in_type, K, out, out_type, N)

    def _run(self, algo, N, T, K, w, x, out, in_type, out_type):
        la, lb, lc = self._shape_layouts(N, T, K, in_type, out_type)
        self.lt.matmul(self.handle, self._matmul_desc(), self._one.ctypes.data, w, la, x, lb,
                       self._zero.ctypes.data, out, lc, out, lc, algo, self._ws.data.ptr, self._ws.nbytes,
                       self.stream.ptr)

    def _set(self, setter, dtype_of, obj, attr, value):
        v = np.array(value, dtype=dtype_of(attr))
        setter(obj, attr, v.ctypes.data, v.itemsize)

    def _matmul_desc(self):
        if self._desc is None:
            lt = self.lt
            self._desc = lt.matmul_desc_create(_COMPUTE_32F, _R_32F)
            for attr, v in ((lt.MatmulDescAttribute.TRANSA, _OP_T), (lt.MatmulDescAttribute.TRANSB, _OP_N)):
                self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, self._desc, attr, v)
        return self._desc

    def _layout(self, dtype, rows, cols, ld):
        key = (dtype, rows, cols, ld)
        if key not in self._layouts:
            if len(self._layouts) >= _MAX_SHAPES:
                self._drop_layouts()
            self._layouts[key] = self.lt.matrix_layout_create(dtype, rows, cols, ld)
        return self._layouts[key]

    def _drop_layouts(self):
        for layout in self._layouts.values():
            self.lt.matrix_layout_destroy(layout)
        self._layouts.clear()
        self._fits.clear()

    def _shape_layouts(self, N, T, K, in_type, out_type):
        """Column-major: w[N, K] row-major is A = K x N (op T), x[T, K] is B = K x T, out[T, N] is C = N x T."""
        return self._layout(in_type, K, N, K), self._layout(in_type, K, T, K), self._layout(out_type, N, T, N)

    def _accepts(self, c, N, T, K, in_type, out_type) -> bool:
        """Whether cuBLASLt can run the bucket's algorithm at these rows (checked once per rows)."""
        if T == c.rows:
            return True
        key = (id(c), T)
        if key not in self._fits:
            la, lb, lc = self._shape_layouts(N, T, K, in_type, out_type)
            try:
                self.lt.matmul_algo_check(self.handle, self._matmul_desc(), la, lb, lc, lc, c.algo,
                                          self._check_result.ptr)
                self._fits[key] = int(self._check_result.workspace_size) <= self._ws.nbytes
            except self.lt.cuBLASLtError:
                self._fits[key] = False
        return self._fits[key]

    def _candidates(self, N, T, K, in_type, out_type, align):
        """cuBLASLt's heuristic: up to CANDIDATES algorithms for this shape and alignment -> (results, algo ptrs)."""
        lt = self.lt
        la, lb, lc = self._shape_layouts(N, T, K, in_type, out_type)
        pref = lt.matmul_preference_create()
        P = lt.MatmulPreferenceAttribute
        try:
            for attr, v in ((P.MAX_WORKSPACE_BYTES, self._ws.nbytes),
                            (P.REDUCTION_SCHEME_MASK,
                             int(lt.ReductionScheme.COMPUTE_TYPE | lt.ReductionScheme.OUTPUT_TYPE)),
                            (P.MIN_ALIGNMENT_A_BYTES, align), (P.MIN_ALIGNMENT_B_BYTES, align),
                            (P.MIN_ALIGNMENT_C_BYTES, align), (P.MIN_ALIGNMENT_D_BYTES, align)):
                self._set(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref, attr,
                          v)
            results, count = lt.MatmulHeuristicResult(CANDIDATES), np.zeros(1, np.int32)
            lt.matmul_algo_get_heuristic(self.handle, self._matmul_desc(), la, lb, lc, lc, pref, CANDIDATES,
                                         results.ptr, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        size = np.dtype(lt.matmul_heuristic_result_dtype).itemsize  # the algo struct is each result's first field
        return results, [results.ptr + i * size for i in range(int(count[0]))]

    def _config(self, algo) -> tuple:
        lt, A = self.lt, self.lt.MatmulAlgoConfigAttribute
        out = []
        for attr in (A.ID, A.TILE_ID, A.SPLITK_NUM, A.STAGES_ID):
            v = np.zeros(1, lt.get_matmul_algo_config_attribute_dtype(attr))
            lt.matmul_algo_config_get_attribute(algo, attr, v.ctypes.data, v.itemsize, 0)
            out.append(int(v[0]))
        return tuple(out)

    def _measure(self, N, T, K, w, x, out, in_type, out_type) -> _Choice:
        """Time gemmEx and the candidates on these operands; leave the chosen one's product in out."""
        args = (N, T, K, w, x, out, in_type, out_type)
        align = alignment(w, x, out)
        results, algos = self._candidates(N, T, K, in_type, out_type, align)
        runs = [None]  # None: gemmEx
        for algo in algos:  # warm up (loads each algorithm's kernels); drop any cuBLASLt refuses to run
            try:
                self._run(algo, *args)
                runs.append(algo)
            except self.lt.cuBLASLtError:
                pass
        times = self._times_us([lambda a=algo: self._gemm_ex(*args) if a is None else self._run(a, *args)
                                for algo in runs])
        best = min(range(len(runs)), key=times.__getitem__)
        if best and times[best] < MARGIN * times[0]:
            c = _Choice(T, align, runs[best], results, tuple(times), self._config(runs[best]))
            self._run(c.algo, *args)
        else:
            c = _Choice(T, align, times_us=tuple(times))
            self._gemm_ex(*args)
        return c

    def _times_us(self, fns) -> list:
        """µs a call of each fn: CALLS calls of it captured as one CUDA graph, the graphs replayed in turn for
        REPEATS rounds, the median round of each. From graphs, as a step runs them: timed one by one from Python,
        a call's launch cost (~10 µs) outweighed the GEMMs of 512-2,048 rows and picked algorithms at random."""
        cp, stream = self.cp, self.stream
        graphs = []
        for fn in fns:
            stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
            try:
                for _ in range(CALLS):
                    fn()
            finally:
                graphs.append(stream.end_capture())
        events = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in fns] for _ in range(REPEATS)]
        for rnd in events:
            for g, (start, stop) in zip(graphs, rnd):
                start.record(stream)
                g.launch(stream)
                stop.record(stream)
        stream.synchronize()
        return [float(np.median([cp.cuda.get_elapsed_time(*rnd[i]) for rnd in events])) * 1e3 / CALLS
                for i in range(len(fns))]
