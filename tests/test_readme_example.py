"""The README's worked example of a new method runs as printed and is lossless (a README whose example
has drifted from the interface fails here)."""

import re
from pathlib import Path

from specbench import registry
from specbench.decoding.engine import Engine
from specbench.methods.ar import Autoregressive

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_bigram_example_drafts_and_equals_ar(tiny_llama):
    code = next(block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
                if 'register("bigram")' in block)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    try:
        drafter = namespace["Bigram"](vocab_size=97, num_pred_tokens=3)
        assert drafter.settings.num_pred_tokens == 3
        prompt = [1, 5, 9, 5, 9, 5, 9, 12, 40, 3] * 3
        engine = Engine(tiny_llama, eos_token_ids=[])
        out = engine.generate(prompt, drafter, 40)
        assert out.tokens == engine.generate(prompt, Autoregressive(), 40).tokens
        assert max(out.accept_lengths) > 1  # it drafted, and some drafts were accepted
    finally:
        registry._REGISTRY.pop("bigram", None)
