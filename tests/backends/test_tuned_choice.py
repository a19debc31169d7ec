"""How a "tuned" projection picks its cuBLAS algorithm (toolkit/backends/cuda_tuned.py), without a GPU: a stand-in
cuBLASLt whose algorithms take set times on a simulated clock, and a stand-in stream and events. Checked: a
cuBLASLt algorithm replaces gemmEx only when measured at least 1 - MARGIN faster; the choice is measured once per
row bucket and shared by every TunedGemm of the process; a capture never measures or records; rows the bucket's
algorithm does not accept, less-aligned pointers and algorithms cuBLASLt refuses to run fall back to gemmEx."""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit.backends import cuda_tuned
from toolkit.backends.cuda_tuned import MARGIN, TunedGemm, alignment, row_bucket

GEMM_EX_US = 100.0


class LtError(Exception):
    pass


class FakeLt:
    """cuBLASLt's calls as TunedGemm makes them. Algorithms are ids 1..len(times); `times` their µs (None: refused
    at run time); `rejects`: rows at which matmul_algo_check refuses every algorithm."""
    cuBLASLtError = LtError
    MatmulDescAttribute = SimpleNamespace(TRANSA=0, TRANSB=1)
    MatmulPreferenceAttribute = SimpleNamespace(MAX_WORKSPACE_BYTES=0, REDUCTION_SCHEME_MASK=1, MIN_ALIGNMENT_A_BYTES=2,
                                                MIN_ALIGNMENT_B_BYTES=3, MIN_ALIGNMENT_C_BYTES=4,
                                                MIN_ALIGNMENT_D_BYTES=5)
    MatmulAlgoConfigAttribute = SimpleNamespace(ID=0, TILE_ID=1, SPLITK_NUM=2, STAGES_ID=3)
    ReductionScheme = SimpleNamespace(COMPUTE_TYPE=2, OUTPUT_TYPE=4)
    matmul_heuristic_result_dtype = np.dtype([("algo", "u8", 8), ("ws", "u8")])

    def __init__(self, device, times, rejects=()):
        self.device, self.times, self.rejects = device, list(times), set(rejects)
        self.ran, self.heuristic_calls, self.layout_rows = device.ran, 0, {}

    def create(self):
        return 1

    def matmul_desc_create(self, *a):
        return 2

    def get_matmul_desc_attribute_dtype(self, attr):
        return np.int32

    get_matmul_preference_attribute_dtype = get_matmul_algo_config_attribute_dtype = get_matmul_desc_attribute_dtype

    def matmul_desc_set_attribute(self, *a):
        pass

    def matmul_preference_set_attribute(self, *a):
        pass

    def matmul_preference_create(self):
        return 3

    def matmul_preference_destroy(self, p):
        pass

    def matrix_layout_create(self, dtype, rows, cols, ld):
        handle = 1000 + len(self.layout_rows)
        self.layout_rows[handle] = cols  # B's and C's columns are the rows T
        return handle

    def matrix_layout_destroy(self, layout):
        pass

    def MatmulHeuristicResult(self, n):
        return SimpleNamespace(ptr=1 << 20, workspace_size=0)

    def matmul_algo_get_heuristic(self, handle, desc, la, lb, lc, ld, pref, want, results, count_ptr):
        self.heuristic_calls += 1
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int32 * 1).from_address(count_ptr))[0] = min(want,
                                                                                                 len(self.times))

    def _id(self, algo):
        return (algo - (1 << 20)) // self.matmul_heuristic_result_dtype.itemsize + 1

    def matmul(self, handle, desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_size, stream):
        t = self.times[self._id(algo) - 1]
        if t is None:
            raise LtError("CUBLAS_STATUS_NOT_SUPPORTED")
        self.device.run(t, self._id(algo))

    def matmul_algo_check(self, handle, desc, la, lb, lc, ld, algo, result):
        if self.layout_rows[lb] in self.rejects:
            raise LtError("CUBLAS_STATUS_INVALID_VALUE")

    def matmul_algo_config_get_attribute(self, algo, attr, buf, size, written):
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int32 * 1).from_address(buf))[0] = self._id(algo) * 10 + attr


class Device:
    """A simulated GPU: a clock (µs) that work advances, the ids of what ran outside captures (0: gemmEx), and the
    stream's capture: launches recorded into a graph whose replay runs them."""

    def __init__(self):
        self.clock, self.ran, self.recording = 0.0, [], None

    def run(self, us, what):
        if self.recording is not None:
            self.recording.append((us, what))
        else:
            self.clock += us
            self.ran.append(what)


class FakeCp:
    """cp.cuda's Event / get_elapsed_time / Device / capture mode on the simulated clock."""

    def __init__(self, device):
        class Event:
            def record(self, stream):
                self.t = device.clock

        self.cuda = SimpleNamespace(Event=Event, Device=lambda: SimpleNamespace(id=0),
                                    get_elapsed_time=lambda a, b: (b.t - a.t) / 1e3,
                                    runtime=SimpleNamespace(streamCaptureModeRelaxed=2))


class Graph:
    def __init__(self, device, calls):
        self.device, self.calls = device, calls

    def launch(self, stream):
        for us, _ in self.calls:
            self.device.clock += us  # (a replay is not a call of the caller's: not in `ran`)


class Stream:
    ptr, capturing = 0, False

    def __init__(self, device):
        self.device = device

    def is_capturing(self):
        return self.capturing or self.device.recording is not None

    def begin_capture(self, mode):
        self.device.recording = []

    def end_capture(self):
        calls, self.device.recording = self.device.recording, None
        return Graph(self.device, calls)

    def synchronize(self):
        pass


def tuned(times, rejects=()):
    device = Device()
    lt = FakeLt(device, times, rejects)
    g = TunedGemm(FakeCp(device), Stream(device), lambda *args: device.run(GEMM_EX_US, 0),
                  SimpleNamespace(data=SimpleNamespace(ptr=0), nbytes=1 << 25), lt=lt)
    return g, lt


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(cuda_tuned, "_CHOICES", {})


def call(g, T, N=896, K=4864, ptr=1 << 12):
    g(N, T, K, ptr, ptr, ptr, 14, 14)


def test_a_clearly_faster_algorithm_is_chosen_and_replayed():
    g, lt = tuned([105.0, 80.0, 99.0])
    call(g, 4096)
    c = g.choice(896, 4096, 4864, 14, 14)
    assert c.algo is not None and lt._id(c.algo) == 2 and c.times_us == (100.0, 105.0, 80.0, 99.0)
    assert c.describe() == "cuBLASLt algo 20 tile 21 split-K 22 stages 23"
    assert lt.ran[-1] == 2  # the caller's output is the chosen algorithm's
    lt.ran.clear()
    call(g, 4096)
    assert lt.ran == [2] and lt.heuristic_calls == 1  # measured once


def test_within_the_margin_gemm_ex_stays():
    g, lt = tuned([100.0 * MARGIN + 0.5, 101.0])
    call(g, 2048)
    c = g.choice(896, 2048, 4864, 14, 14)
    assert c.algo is None and c.describe() == "gemmEx" and lt.ran[-1] == 0
    lt.ran.clear()
    call(g, 2048)
    assert lt.ran == [0]


def test_one_measurement_a_bucket_shared_across_backends():
    g, lt = tuned([50.0])
    call(g, 3000)  # bucket 4,096, measured at 3,000 rows
    assert g.choice(896, 4096, 4864, 14, 14).rows == 3000
    other, lt2 = tuned([50.0])
    call(other, 4096)
    assert lt2.heuristic_calls == 0 and lt2.ran == [1]  # the first's choice, not measured again
    call(other, 1024)  # another bucket: measured
    assert lt2.heuristic_calls == 1


def test_a_capture_neither_measures_nor_records():
    g, lt = tuned([10.0])
    g.stream.capturing = True
    call(g, 1024)
    assert lt.ran == [0] and lt.heuristic_calls == 0 and g.choice(896, 1024, 4864, 14, 14) is None
    g.stream.capturing = False
    call(g, 1024)
    assert g.choice(896, 1024, 4864, 14, 14).algo is not None


def test_rows_the_algorithm_does_not_take_and_unaligned_pointers_run_gemm_ex():
    g, lt = tuned([10.0], rejects={1500})
    call(g, 2048)
    lt.ran.clear()
    call(g, 1500)  # same bucket, refused by matmul_algo_check
    call(g, 1800)  # accepted
    call(g, 2048, ptr=(1 << 12) + 4)  # measured with 256-byte aligned pointers; this one is 4-byte aligned
    assert lt.ran == [0, 1, 0]


def test_algorithms_cublaslt_refuses_to_run_are_dropped():
    g, lt = tuned([None, 30.0])
    call(g, 8192)
    c = g.choice(896, 8192, 4864, 14, 14)
    assert lt._id(c.algo) == 2 and c.times_us == (100.0, 30.0)


@given(st.integers(1, 1 << 20))
def test_row_bucket_is_the_power_of_two_at_or_above(rows):
    b = row_bucket(rows)
    assert b >= rows and b & (b - 1) == 0 and (b == 1 or b // 2 < rows)


def test_alignment():
    assert alignment(1 << 12, 1 << 9) == 256 and alignment(1 << 12, 2 + (1 << 12)) == 2 and alignment(0) == 256
