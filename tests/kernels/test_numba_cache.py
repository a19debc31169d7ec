"""Rules that keep numba's on-disk cache (`@njit(cache=True)`, every CPU kernel) correct on a warm cache.

A cache entry is keyed on its own file's source hash and the argument types, nothing else, and is linked into a
process beside entries that other processes wrote. Three ways that goes wrong, each a rule checked here on the
source of kernels/*.py:

1. Globals are compile-time constants. A jitted function that reads a module global freezes its value into the
   cached code, so a global that anything reassigns (a test's monkeypatch, a setter) serves its old value from the
   cache. Rule: a jitted function reads only names defined in its own module: functions, imports of numpy/numba,
   and ALL_CAPS constants assigned once at import and never assigned anywhere in the repository.
2. Callees in other files. The cache of a function that calls a jitted function of another file holds that
   callee's code, and numba does not notice when the other file changes. Rule: a jitted function calls no name
   imported from another kernels module.
3. Numba's sort and partition helpers. Numba names a compiled function by qualified name, argument types and a
   per-process counter; its sort and partition factories make different helpers (np.sort's and np.argsort's, say)
   under one name with the same types. Two cache files written by different processes can then define one symbol
   with two bodies, and the first loaded serves both: after `generate` and the suite, sparse_prefill's cached
   np.sort stood in for prefill_attention._plan's np.argsort (garbage work items, MemoryError, a segfault). Rule:
   no jitted function calls sort, argsort, sorted, partition, argpartition, unique, searchsorted, median, ...
"""
import ast
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = sorted((ROOT / "kernels").glob("*.py"))
CONSTANT = re.compile(r"_?[A-Z][A-Z0-9_]*$")
# Third-party modules a jitted body may name (np.float32, prange, ...).
LIBRARIES = {"numpy", "numba", "math"}
# Numba implements these with sort / partition / search factories (numba/misc/quicksort.py, mergesort.py,
# numba/np/arraymath.py _partition_factory, _select_factory, searchsorted): rule 3.
SORTS = {"sort", "argsort", "sorted", "lexsort", "partition", "argpartition", "unique", "searchsorted", "digitize",
         "histogram", "median", "nanmedian", "percentile", "nanpercentile", "quantile", "nanquantile"}


def _jitted(tree):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            yield node


def _module_names(tree):
    """name -> ("def" | "assign" | "import", module or None, count of module-level assignments)."""
    names, counts = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = ("def", None)
        elif isinstance(node, ast.Import):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = ("import", a.name)
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            for a in node.names:
                names[a.asname or a.name] = ("import", mod)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names[n.id] = ("assign", None)
                        counts[n.id] = counts.get(n.id, 0) + 1
    return names, counts


def _free_names(fn):
    local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local


def _reads():
    """(kernel file, jitted function, global name, its kind) for every global a jitted body reads."""
    import builtins
    out = []
    for path in KERNELS:
        tree = ast.parse(path.read_text())
        names, counts = _module_names(tree)
        for fn in _jitted(tree):
            for name in sorted(_free_names(fn) - set(dir(builtins))):
                out.append((path, fn.name, name, names.get(name, ("missing", None)), counts.get(name, 0)))
    return out


def _assignments_anywhere(names):
    """name -> places in the repository's Python that assign `something.name`, setattr(..., "name") /
    monkeypatch.setattr(..., "name") / setattr("pkg.mod.name", ...), or declare `global name`, for each of `names`.
    One parse and one walk of each file for all names (a walk per name took half a minute of every test run)."""
    names = set(names)
    hits = {name: [] for name in names}

    for top in ("kernels", "toolkit", "tests", "tui", "dev", "experiments", "benchmarks"):
        for path in (ROOT / top).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Attribute) and n.attr in names:
                                hits[n.attr].append(where)
                elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) \
                        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "setattr":
                    for a in node.args[:2]:
                        # "name" or "pkg.mod.name": the last part (a name has no dot)
                        last = a.value.rsplit(".", 1)[-1] if isinstance(a, ast.Constant) \
                            and isinstance(a.value, str) else None
                        if last in names:
                            hits[last].append(where)
                elif isinstance(node, ast.Global):
                    for name in names.intersection(node.names):
                        hits[name].append(where)
    return hits


def test_rules_see_the_kernels():
    """The scan finds the jitted kernels and the globals they read (else every rule below passes vacuously)."""
    reads = _reads()
    assert len({(p, f) for p, f, *_ in reads}) >= 20
    assert ("prefill_attention.py", "attend", "BK") in {(p.name, f, n) for p, f, n, *_ in reads}


def test_jitted_globals_are_constants():
    """Rule 1: every module-level value a jitted function reads is an ALL_CAPS constant assigned once."""
    bad = []
    for path, fn, name, (kind, mod), count in _reads():
        where = f"{path.relative_to(ROOT)} {fn}: {name}"
        if kind == "missing":
            bad.append(f"{where} is not defined at module level")
        elif kind == "assign" and not (CONSTANT.match(name) and count == 1):
            bad.append(f"{where} is a module variable (assigned {count}x; constants are ALL_CAPS, assigned once)")
    assert not bad, "\n".join(bad)


def test_jitted_globals_never_reassigned():
    """Rule 1: nothing in the repository reassigns or monkeypatches a constant a jitted function reads: the
    cached code would keep the old value. Pass such a value as an argument (see PARALLEL_MIN_MACS)."""
    constants = sorted({name for _, _, name, (kind, _), _ in _reads() if kind == "assign"})
    assert constants  # BK, ROWS, ...
    bad = {k: v for k, v in _assignments_anywhere(constants).items() if v}
    assert not bad, bad


def test_jitted_functions_call_only_their_own_file():
    """Rule 2: no jitted body names a function or constant imported from another kernels module."""
    bad = []
    for path, fn, name, (kind, mod), _ in _reads():
        if kind == "import" and mod.split(".")[0] not in LIBRARIES:
            bad.append(f"{path.relative_to(ROOT)} {fn}: {name} from {mod}")
    assert not bad, "\n".join(bad)


def test_jitted_functions_call_no_numba_sort():
    """Rule 3: no jitted body calls numba's sort / partition / search implementations."""
    bad = []
    for path in KERNELS:
        for fn in _jitted(ast.parse(path.read_text())):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if callee in SORTS:
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {fn.name}: {ast.unparse(node.func)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_descending_order_is_a_stable_argsort(dtype):
    """The merge sorts that replace np.argsort (kernels/prefill_attention.py, its copy in sparse_prefill.py) equal
    NumPy's stable argsort of -x: ties in index order, NaN last."""
    from kernels.prefill_attention import descending_order
    from kernels.sparse_prefill import _descending_order
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, 7, 64, 100, 1000):
        x = rng.integers(-3, 4, n).astype(dtype)  # many ties
        if dtype == np.float32 and n >= 4:
            x[rng.integers(0, n, 3)] = np.nan
            x[0], x[1] = -np.inf, np.inf
        ref = np.argsort(-x, kind="stable")
        assert descending_order(x).tolist() == ref.tolist()
        assert _descending_order(x).tolist() == ref.tolist()
