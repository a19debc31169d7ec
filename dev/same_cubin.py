"""Does an edit to a kernel change its machine code? Compile kernels/<op>.cu at a git revision and in the working tree
with NVRTC for sm_90 (the options of tests/kernels/test_cuda_compile.py, each tree with its own name expressions),
no GPU needed, and compare:
  - the whole cubins: IDENTICAL or not;
  - each kernel the working tree keeps (mapped to its name at REV by MAP where a template was renamed): every ELF
    section that belongs to it (.text.<sym> byte for byte, .nv.info.<sym>, .nv.shared.<sym>, .nv.constant0.<sym>,
    .rela.text.<sym>, each with its header), its symbol, and its entries in the global .nv.info (registers, frame
    and stack sizes), with section and symbol indices replaced by names (they shift when other kernels go).
Where a kept kernel is identical, what the GPU measured on that revision holds for the edit: a refactor (a helper,
comments, a removed sibling kernel) checked this way needs no new device time.

    PYTHONPATH=. python dev/same_cubin.py OP REV [-v] [--sm90a]   e.g. PYTHONPATH=. python dev/same_cubin.py gemv 9e518e7
(--sm90a: the op's Hopper kernels, sm90a_kernel_names, built for sm_90a; a REV from before they existed has none)
"""
import json
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import cuda.pathfinder as pf
from cupy_backends.cuda.libs import nvrtc

OPTIONS = ("-std=c++17",)
CTYPES = ("float", "__half", "__nv_bfloat16")
# A template renamed since REV: its working-tree name expression -> REV's (decode_attention lost its RoPE variant)
SM90A = "--sm90a" in sys.argv  # the op's second module: its wgmma kernels, built for sm_90a (sm90a_kernel_names)
MAP = [(re.compile(r"^decode_attention<([^,]+), (\d+)>$"), r"decode_attention<\1, \2, false>")]


def names(tree: Path, op: str) -> list:
    fn = "sm90a_kernel_names" if SM90A else "kernel_names"
    code = (f"import json, sys; from toolkit.backends.cuda_kernels import {fn}; "
            f"print(json.dumps(sorted({{n for ct in {CTYPES!r} for n in {fn}({op!r}, ct)}})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin"},
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def compile_op(tree: Path, op: str, exprs: list):
    kd = tree / "kernels"
    src = re.sub(r'^#include "([\w.]+\.cuh)"$', lambda m: (kd / m.group(1)).read_text(), (kd / f"{op}.cu").read_text(),
                 flags=re.MULTILINE)
    base = ["-arch=sm_90a" if SM90A else "-arch=sm_90", f"-I{pf.find_nvidia_header_directory('cudart')}", "-ftz=true",
            "--device-as-default-execution-space", *OPTIONS]
    prog = nvrtc.createProgram(src, f"{op}.cu", (), ())
    try:
        for n in exprs:
            nvrtc.addNameExpression(prog, n)
        nvrtc.compileProgram(prog, base)
        return nvrtc.getCUBIN(prog), {n: nvrtc.getLoweredName(prog, n) for n in exprs}
    finally:
        nvrtc.destroyProgram(prog)


class Elf:
    """Sections and symbols of a 64-bit little-endian cubin."""

    def __init__(self, elf: bytes):
        self.b = elf
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
        self.hdrs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        self.names = [self._str(self.hdrs[shstrndx], h[0]) for h in self.hdrs]
        symtab = next(h for h, n in zip(self.hdrs, self.names) if n == ".symtab")
        d = self.data(symtab)
        self.syms = [struct.unpack_from("<IBBHQQ", d, 24 * k) for k in range(len(d) // 24)]
        self.symnames = [self._str(self.hdrs[symtab[6]], s[0]) for s in self.syms]

    def _str(self, strtab, off):
        s = strtab[4] + off
        return self.b[s:self.b.index(b"\0", s)].decode()

    def data(self, h):
        return b"" if h[1] == 8 else self.b[h[4]:h[4] + h[5]]

    def sec(self, i):
        return self.names[i] if 0 < i < len(self.names) else i

    def sym(self, i):
        return self.symnames[i] if 0 < i < len(self.symnames) else i

    def nv_info(self, d):
        """(fmt, attr, value) entries of a .nv.info section."""
        out, j = [], 0
        while j < len(d):
            fmt, attr = d[j], d[j + 1]
            if fmt == 4:
                size, = struct.unpack_from("<H", d, j + 2)
                out.append((fmt, attr, d[j + 4:j + 4 + size]))
                j += 4 + size
            elif fmt == 3:
                out.append((fmt, attr, d[j + 2:j + 4]))
                j += 4
            else:
                out.append((fmt, attr, b""))
                j += 2
        return out

    def kernel(self, name: str) -> dict:
        """Everything of one kernel, with section and symbol indices replaced by names (they shift when other
        kernels come and go): its sections (header and data), its symbol, its entries in the global .nv.info."""
        out = {}
        for h, n in zip(self.hdrs, self.names):
            if not n.endswith("." + name):
                continue
            _, typ, flags, _, _, size, link, info, align, ent = h
            d = self.data(h)
            if n.startswith(".text."):
                info = (self.sym(info & 0xFFFFFF), info >> 24)
            else:
                info = self.sec(info)
            if n.startswith(".rela"):
                d = [(o, self.sym(i >> 32), i & 0xFFFFFFFF, a) for o, i, a in
                     (struct.unpack_from("<QQq", d, 24 * k) for k in range(len(d) // 24))]
            elif n.startswith(".nv.info."):
                d = [(f, a, (self.sym(struct.unpack_from("<I", v)[0]), v[4:]) if a == 0x0A else v)
                     for f, a, v in self.nv_info(d)]
            out[n[:-len(name)]] = (typ, flags, size, self.sec(link), info, align, ent, d)
        k = self.symnames.index(name)
        s = self.syms[k]
        out["symbol"] = (s[1], s[2], self.sec(s[3]), s[4], s[5])
        glob = next(h for h, n in zip(self.hdrs, self.names) if n == ".nv.info")
        out[".nv.info (global)"] = [(f, a, v[4:]) for f, a, v in self.nv_info(self.data(glob))
                                    if f == 4 and len(v) >= 4 and struct.unpack_from("<I", v)[0] == k]
        return out


def export(rev: str) -> Path:
    """The repository at `rev`, in a temporary folder (its own kernels/ and toolkit/ give its names)."""
    out = Path(tempfile.mkdtemp(prefix=f"same_cubin_{rev}_"))
    tar = subprocess.run(["git", "archive", rev, "kernels", "toolkit"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out


def main() -> int:
    op, rev_tree, here = sys.argv[1], export(sys.argv[2]), Path.cwd()
    new_exprs, old_exprs = names(here, op), names(rev_tree, op)
    def old_of(n):
        for pat, rep in MAP:
            if pat.match(n):
                return pat.sub(rep, n)
        return n
    missing = [n for n in new_exprs if old_of(n) not in old_exprs]
    old_cubin, old_low = compile_op(rev_tree, op, old_exprs)
    new_cubin, new_low = compile_op(here, op, new_exprs)
    print(f"{op}: whole cubin {'IDENTICAL' if old_cubin == new_cubin else 'different'} "
          f"({len(old_cubin)} -> {len(new_cubin)} bytes); kernels {len(old_exprs)} -> {len(new_exprs)}"
          + (f"; NEW names without a REV counterpart: {missing}" if missing else ""))
    eo, en = Elf(old_cubin), Elf(new_cubin)
    if not new_exprs:  # extern "C" kernels only: every kernel symbol, by name
        syms = sorted(n[len(".text."):] for n in en.names if n.startswith(".text."))
        pairs = [(n, n, n) for n in syms]
        gone = sorted(set(n[len(".text."):] for n in eo.names if n.startswith(".text.")) - set(syms))
    else:
        pairs = [(n, old_low[old_of(n)], new_low[n]) for n in new_exprs if n not in missing]
        kept = {old_of(n) for n in new_exprs}
        gone = [n for n in old_exprs if n not in kept]
    bad = 0
    for expr, lo, ln in pairs:
        po, pn = eo.kernel(lo), en.kernel(ln)
        for d in (po, pn):  # the kernel's own name inside its view (a renamed template: decode_attention)
            for key in list(d):
                d[key] = repr(d[key]).replace(lo if d is po else ln, "SELF")
        diff = sorted(k for k in set(po) | set(pn) if po.get(k) != pn.get(k))
        if diff:
            bad += 1
        print(f"  {'IDENTICAL' if not diff else 'DIFFERENT'} {expr}  [{', '.join(sorted(pn))}]"
              + (f"  differs: {diff}" if diff else ""))
        if diff and "-v" in sys.argv:
            for k in diff:
                print(f"    {k}\n      old {po.get(k)[:600]}\n      new {pn.get(k)[:600]}")
    if gone:
        print(f"  removed: {gone}")
    print(f"{op}: {len(pairs) - bad}/{len(pairs)} kept kernels identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
