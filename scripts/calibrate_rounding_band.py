"""How far a teacher-forced forward's logits lie from step-by-step decoding's, in units of the dtype's
spacing at each row's largest |logit|: the measurement behind the lossless check's rounding band
(specbench/benchmark/lossless.py, BAND_ULPS; docs/protocol.md, "Lossless check").

    python scripts/calibrate_rounding_band.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.inputs.models import load_model, named_model_config
from specbench.inputs.chat import prompt_ids
from specbench.decoding.kv_cache import with_cache
from specbench.benchmark.lossless import ulp  # noqa: E402
from transformers import DynamicCache  # noqa: E402

torch.set_num_threads(1)
for dt in (torch.bfloat16, torch.float16, torch.float32):
    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), dt)
    worst = []
    for q in ["Write a short story about a robot learning to paint.", "Summarize: The quick brown fox jumps over the lazy dog. It was a sunny day and the fox was happy.", "What is 17 * 23? Explain step by step."]:
        ids = prompt_ids(tok, [{"role": "user", "content": q}])
        cache = DynamicCache()
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), **with_cache(model, cache), use_cache=True, logits_to_keep=1)
            rows = [out.logits[0, -1].float()]
            seq = list(ids)
            for _ in range(48):
                t = int(rows[-1].argmax()); seq.append(t)
                out = model(input_ids=torch.tensor([[t]]), **with_cache(model, cache), use_cache=True)
                rows.append(out.logits[0, -1].float())
            tf = model(input_ids=torch.tensor([seq])).logits[0, len(ids)-1:].float()
        inc = torch.stack(rows)[: tf.shape[0]]
        for i in range(tf.shape[0]):
            scale = float(inc[i].abs().max())
            d = float((tf[i] - inc[i]).abs().max()) / ulp(scale, str(dt).removeprefix("torch."))
            worst.append(d)
    worst.sort()
    print(dt, "max |tf-inc| in ulps of max|z|: median %.2f p99 %.2f max %.2f" % (worst[len(worst)//2], worst[int(len(worst)*0.99)], worst[-1]), flush=True)
