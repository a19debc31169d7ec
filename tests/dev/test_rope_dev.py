"""dev/rope.py's baseline, rope_qkv_warp (dev/rope_warp.cu, rope_qkv before session 17), still compiles against
today's kernels/rope.cu (it uses rope.cuh's rnd and rope_pair), so a GPU session that times the two does not spend
its call on a compile error. No GPU; skips where NVRTC is absent."""
from tests.dev import load_dev_script
from tests.dev.test_prefill_attention_dev import nvrtc_compile

mod = load_dev_script("rope")


def test_the_old_kernel_compiles_next_to_todays():
    import toolkit.backends.cuda_kernels as ck

    for ctype in ("float", "__half", "__nv_bfloat16"):
        names = [f"rope_qkv_warp<{ctype}>"] + ck.rope_names(ctype)
        assert len(nvrtc_compile(mod.warp_source(), names, ck.OPTIONS)) == len(names)
