"""dev/pdl_trigger.py edits the product's kernel sources as text: its edits must still apply to today's kernels
(else a GPU session would time four copies of the same build) and its builds must compile. No GPU; the compile
skips where NVRTC is absent."""
import pytest

from tests.dev import load_dev_script
from tests.dev.test_prefill_attention_dev import nvrtc_compile

mod = load_dev_script("pdl_trigger")
PDL_OPS = ("gemv", "rmsnorm", "rope", "activation", "embedding", "decode_attention", "decode_attention_tc",
           "gemm_skinny")


@pytest.mark.parametrize("op", PDL_OPS)
def test_every_variant_edits_what_it_names(op):
    import toolkit.backends.cuda_kernels as ck

    src = ck.kernel_source(op)
    assert src.count(mod.LATE) == 1  # pdl.cuh's pdl_enter, inlined once
    assert mod.edit_source(src, "late") == src
    early = mod.edit_source(src, "early")
    assert mod.LATE not in early and early.count(mod.EARLY) == 1
    for v in ("late_l2", "early_l2"):
        l2 = mod.edit_source(src, v)
        assert "__ldg(" not in l2 and "__restrict__" not in l2
        assert (mod.EARLY in l2) == v.startswith("early")


@pytest.mark.parametrize("variant", ["early", "early_l2"])
def test_the_edited_kernels_compile(variant):
    import toolkit.backends.cuda_kernels as ck

    options = ck.OPTIONS + (mod.L2_OPTIONS if variant.endswith("_l2") else ())
    for op in ("gemv", "rmsnorm", "decode_attention_tc"):
        names = ck.kernel_names(op, "__nv_bfloat16")
        assert len(nvrtc_compile(mod.edit_source(ck.kernel_source(op), variant), names, options)) == len(names)


def test_variant_names():
    assert mod.split_variant("early") == ("early", 0)
    assert mod.split_variant("late_l2+wave4") == ("late_l2", 4)
    for bad in ("earlier", "early+wave", "early+wavex"):
        with pytest.raises(AssertionError):
            mod.split_variant(bad)


@pytest.mark.parametrize("variant", ["late", "early"])
def test_the_one_wave_gemvs_compile_in_each_order(variant):
    import toolkit.backends.cuda_kernels as ck

    src = mod.wave_source(variant)
    assert src.count(mod.EARLY if variant == "early" else mod.LATE) == 1
    names = ["gemv_wave<__nv_bfloat16, 1>", "gemv_swiglu_wave<__nv_bfloat16, 1>"]
    assert len(nvrtc_compile(src, names, ck.OPTIONS)) == 2
