"""The PyTorch peer's cache path is right: prefill + per-sequence decode give the logits of a full forward.

The peer is only a benchmark, but a wrong cache index or mask would still time the wrong
computation, so check it on the CPU in fp32 (skipped where torch is not installed).
"""
import pytest

torch = pytest.importorskip("torch")

from toolkit.bench.peer import TorchPeer, torch_available  # noqa: E402
from toolkit.model.shapes import shape_config  # noqa: E402

PROMPTS = ([5, 17, 900, 3, 3, 42, 7, 1000, 2, 64], [11, 4000, 12, 13, 8, 9])  # lengths 10 and 6
SPLIT = (6, 2)  # prefill this many tokens of each prompt, decode the remaining 4


@pytest.fixture(scope="module")
def peer():
    return TorchPeer(shape_config("tiny"), dtype="float32", device="cpu", max_batch=2, max_seq_len=64,
                     compile=False)


def full_logits(model, ids):
    t = torch.tensor([ids])
    with torch.no_grad():
        return model(t, torch.arange(len(ids))[None], prefill=True, last_only=False)[0]


@pytest.mark.parametrize("cfg_name", ["tiny", "qwen2-tiny", "qwen3-tiny"])
def test_prefill_then_ragged_decode_matches_full_forward(cfg_name):
    cfg = shape_config("tiny")
    if cfg_name != "tiny":  # same small shape with qwen2's q/k/v bias or qwen3's q/k norm, untied
        from dataclasses import replace
        cfg = replace(cfg, model_type=cfg_name[:5], qkv_bias=cfg_name == "qwen2-tiny",
                      qk_norm=cfg_name == "qwen3-tiny", tie_word_embeddings=False)
    model = TorchPeer(cfg, dtype="float32", device="cpu", max_batch=2, max_seq_len=64, compile=False).model
    want = [full_logits(model, ids) for ids in PROMPTS]
    with torch.no_grad():
        for row, (ids, n) in enumerate(zip(PROMPTS, SPLIT)):  # each sequence prefilled into its own cache row
            last = model(torch.tensor([ids[:n]]), torch.arange(n)[None], prefill=True, row=row)
            torch.testing.assert_close(last[0], want[row][n - 1], rtol=1e-4, atol=1e-4)
        pos = list(SPLIT)
        for _ in range(4):  # both sequences in one batch, each at its own position
            toks = torch.tensor([[PROMPTS[b][pos[b]]] for b in range(2)])
            got = model(toks, torch.tensor(pos)[:, None], window=64)
            for b in range(2):
                torch.testing.assert_close(got[b], want[b][pos[b]], rtol=1e-4, atol=1e-4)
            pos = [p + 1 for p in pos]


def test_timing_api_on_cpu(peer):
    assert torch_available() and torch_available("cuda") == torch.cuda.is_available()
    assert "eager + SDPA" in peer.label
    ms = peer.decode_ms_per_step(batch=2, depth=20, steps=4, repeats=2)
    assert len(ms) == 2 and all(m > 0 for m in ms)
    assert len(peer.prefill_ms(32, repeats=2)) == 2
    with pytest.raises(ValueError):
        peer.decode_ms_per_step(batch=3, depth=0, steps=4, repeats=1)
    with pytest.raises(ValueError):
        peer.decode_ms_per_step(batch=1, depth=60, steps=8, repeats=1)


def test_decode_step_greedy_tokens(peer):
    """The step the bench times (argmax inside) continues the full forward's greedy choice."""
    ids = PROMPTS[0]
    want = full_logits(peer.model, ids).argmax(-1)
    with torch.no_grad():
        peer.model(torch.tensor([ids[:-1]]), torch.arange(len(ids) - 1)[None], prefill=True)
        got = peer._decode(torch.tensor([ids[-1]]), torch.tensor([len(ids) - 1]), 64)
    assert got.tolist() == [want[-1].item()]
