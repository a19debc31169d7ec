"""A real trained model: stories260K (../shared/models, skipped where absent)."""
from toolkit.engine.build import build_engine

EXPECTED = ", there was a little girl named Lily. She loved to play outside in the park."


def test_greedy_story(stories_dir):
    engine = build_engine(stories_dir, device="cpu")
    ids = engine.tokenizer.encode("Once upon a time")
    assert ids == [1, 403, 407, 261, 378]
    text = "".join(r.text for r in engine.generate(ids, max_tokens=40))
    assert text.startswith(EXPECTED), text
