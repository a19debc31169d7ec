"""dev/profile_sampler.py edits kernels/sampler.cu's text into its variants: every edit must still apply to
today's source (a stale one stops the GPU run it was meant for), and each variant must differ from the kernel as
built. String work only: no GPU, no compiler."""
from tests.dev import load_dev_script


def load():
    return load_dev_script("profile_sampler")


def test_every_variant_applies_and_differs():
    from toolkit.backends.cuda_kernels import kernel_source

    mod = load()
    built = kernel_source("sampler")
    variants = mod.variants()
    assert variants["as built"][0] == built
    for name, (src, blocks, cpt) in variants.items():
        assert blocks in (2, 3, 4) and cpt in (1, 2), name
        if name != "as built":
            assert src != built, f"{name}: its edit changed nothing"
        assert f"constexpr int GS_BLOCKS = {blocks};" in src, f"{name}: launched for {blocks} blocks an SM"


def test_stats_counts_four_things():
    from toolkit.backends.cuda_kernels import kernel_source

    src = load().stats_source(kernel_source("sampler"))
    assert src.count("atomicAdd(&g_stat[") == 4
