#!/usr/bin/env python
"""Train Medusa-1 heads on a frozen model by self-distillation.

1. prompts: composed offline from sources that are not benchmark questions: Python's own reference
   docs (pydoc_data.topics, as the REST datastore), the docstrings of the standard library's
   modules (read with `ast`, nothing is imported), and templates of our own for the chat categories
   (writing, roleplay, reasoning, math, coding, extraction, stem/humanities, translation,
   summarization, qa, rag). Any prompt sharing an 8-word window with a Spec-Bench question or a
   built-in `mini` prompt is dropped.
2. data: the model's own greedy answers (batched, left padding, the benchmark's chat template),
   recording the last hidden state (after the final norm, lm_head's input) at every answer
   position. Hidden states and tokens are cached on disk per batch, so training epochs, a resumed
   run or another training setting never recompute them.
3. training: the model stays frozen; head k at answer position t predicts the token at t+k+2;
   loss = sum_k 0.8^k CE_k. By default the heads share the model's lm_head (only the ResBlocks are
   trained and saved: a few MB); --own-projection trains a per-head projection initialised from
   lm_head, as the published Medusa-1 heads do.
4. evaluation: per-head top-1 / top-5 accuracy on held-out prompts (a split of the generated data),
   for the trained heads as saved (float16) and for untrained heads (the identity ResBlock, i.e.
   lm_head reading h_t) as the reference.

Examples:
  python scripts/train_medusa.py --model smollm2-135m --out data/medusa/smollm2-135m
  python scripts/train_medusa.py --model vicuna-7b --model-path /models/vicuna-7b-v1.3 \\
      --device cuda --dtype float16 --num-prompts 20000 --max-new-tokens 512 --batch-size 64 \\
      --num-heads 5 --own-projection --epochs 2 --out ~/medusa/vicuna-7b
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import torch

from specbench.decoding.kv_cache import with_cache
from specbench.inputs.chat import prompt_ids
from specbench.methods.medusa.heads import MedusaHeads, load_heads, save_heads
from specbench.inputs.models import cache_root, eos_token_ids, load_model, resolve_device, resolve_dtype

ROOT = Path(__file__).resolve().parents[1]


HEAD_WEIGHT = 0.8  # loss weight of head k is 0.8^k, as in Medusa's training script
IGNORE = -100

# ---------------------------------------------------------------------------------------------
# 1. prompts


WRITING_SUBJECTS = [
    "an old bicycle", "a rainy morning in a small town", "the first day of autumn", "a lost umbrella",
    "a chess tournament", "a bakery at dawn", "a mountain village", "a robot learning to paint",
    "a friendship between a cat and a crow", "the night sky over a desert", "a forgotten library",
    "a summer thunderstorm", "a train journey across the plains", "a garden in winter", "a street musician",
    "an abandoned space station", "the ocean at night", "a grandmother's recipe book", "a city marathon",
    "a snowy mountain cabin", "a fishing boat returning home", "a child's first day at school",
    "a clock tower that stopped", "a market on a Sunday morning", "a paper boat in a stream",
    "a firefly in a jar", "an astronaut looking at Earth", "a quiet railway station", "a kite festival",
    "a tree that is five hundred years old",
]
WRITING_FORMS = [
    "Write a short poem about {}.", "Write a short story about {}.", "Write a haiku about {}.",
    "Write the opening paragraph of a blog post about {}.", "Describe {} in one vivid paragraph.",
    "Write a limerick about {}.", "Write a diary entry about {}.", "Write a song chorus about {}.",
]
ROLES = [
    "a ship captain", "a medieval blacksmith", "a museum guide", "a park ranger", "a space station engineer",
    "a detective in 1920s London", "a chef in a busy restaurant", "a mountain guide", "a librarian",
    "a beekeeper", "a train conductor", "a marine biologist", "a carpenter", "a night-shift nurse",
    "a street food vendor", "a wildlife photographer", "a radio host", "a gardener", "a pilot",
    "a school teacher",
]
ROLE_FORMS = [
    "You are {}. Introduce yourself to a new visitor.", "Pretend to be {} and describe a typical day.",
    "As {}, give three pieces of advice to a beginner.", "Imagine you are {}. What is the hardest part of your job?",
]
CONCEPTS = [
    "photosynthesis", "the water cycle", "inflation", "plate tectonics", "how vaccines work",
    "the Pythagorean theorem", "black holes", "the French Revolution", "the Renaissance", "supply and demand",
    "DNA replication", "the greenhouse effect", "machine learning", "the printing press",
    "democracy in ancient Athens", "the Silk Road", "the Industrial Revolution", "electric circuits", "gravity",
    "the immune system", "volcanoes", "the Roman Empire", "impressionist painting", "the scientific method",
    "probability", "ocean tides", "earthquakes", "the periodic table", "antibiotics", "the internet",
    "the phases of the moon", "natural selection", "cryptography", "the Cold War", "jazz music",
    "Shakespeare's plays", "the Olympic Games", "compound interest", "rainbows", "sound waves",
    "the solar system", "pollination", "glaciers", "the Magna Carta", "batteries", "the human heart",
    "renewable energy", "the stock market", "ancient Egyptian pyramids", "the theory of relativity",
]
CONCEPT_FORMS = [
    "Explain {} to a high school student.", "What is {}? Answer briefly.", "Give three interesting facts about {}.",
    "Write a short quiz with three questions about {}.", "Why is {} important? Explain in a few sentences.",
]
CODING_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the vowels in a sentence",
    "merges two sorted lists", "computes the factorial of n", "finds the largest element in a list",
    "removes duplicates from a list while keeping the order", "converts Celsius to Fahrenheit",
    "checks if a string is a palindrome", "returns the n-th Fibonacci number", "flattens a nested list",
    "counts word frequencies in a text", "implements binary search", "sorts a list of dictionaries by a key",
    "computes the greatest common divisor of two numbers", "transposes a matrix",
    "generates all permutations of a list", "finds the second smallest number in a list",
    "checks whether two words are anagrams", "sums the digits of an integer",
]
CODING_FORMS = [
    "Write a Python function that {}.", "Write a JavaScript function that {}.",
    "Explain step by step how to write a program that {}.", "Write a C function that {}.",
]
MATH_TEMPLATES = [
    "A library has {a} books. It buys {b} new books each month. How many books will it have after {c} months? Show your work.",
    "A train travels at {a} kilometres per hour for {b} hours. How far does it go? Explain step by step.",
    "A shop sells pencils at {a} cents each. How much do {b} pencils cost in dollars? Think step by step.",
    "Sara saves {a} dollars every week. How many weeks does she need to save {d} dollars? Explain.",
    "A rectangle is {a} metres long and {b} metres wide. What are its area and its perimeter?",
    "What is {a} multiplied by {b}, minus {c}? Show each step.",
    "A school has {b} classes with {a} students each. If {c} students are absent, how many are present? Explain your reasoning.",
    "A recipe needs {a} grams of flour for {b} cookies. How much flour is needed for {e} cookies? Think step by step.",
    "A cyclist rides {a} kilometres on Monday and {b} kilometres on Tuesday. How many kilometres is that in total, and what is the average per day?",
    "A tank holds {d} litres of water and loses {c} litres every hour. How many hours until it holds {a} litres? Explain.",
]
NAMES = ["Ava", "Ben", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kemal", "Lena",
         "Mateo", "Nora", "Omar", "Priya"]
NONSENSE = ["florps", "grindles", "wumbats", "zorkels", "plinths", "quibbets", "snarfs", "trovels", "mibbles",
            "yantrons", "dorbs", "kelpins"]
FOREIGN = [
    ("German", "Die Kinder spielen im Park, während ihre Eltern auf einer Bank sitzen."),
    ("German", "Das Museum ist montags geschlossen, aber am Wochenende ist es bis zehn Uhr geöffnet."),
    ("German", "Nach dem Regen roch die Luft nach nassem Gras und frischer Erde."),
    ("German", "Mein Bruder lernt seit zwei Jahren Geige und spielt schon recht gut."),
    ("German", "Die neue Brücke verbindet die beiden Stadtteile und spart viel Zeit."),
    ("German", "Wir haben uns verlaufen und mussten einen Bauern nach dem Weg fragen."),
    ("German", "Im Winter fahren viele Familien in die Berge, um Ski zu fahren."),
    ("German", "Der Bäcker öffnet seinen Laden jeden Morgen um sechs Uhr."),
    ("French", "Le marché du samedi attire des visiteurs de toute la région."),
    ("French", "Elle a oublié son parapluie dans le train et il pleuvait toute la journée."),
    ("French", "Les étudiants préparent un exposé sur l'histoire de leur ville."),
    ("French", "Nous avons dîné sur la terrasse en regardant le coucher du soleil."),
    ("French", "Le musée présente une exposition de photographies anciennes."),
    ("French", "Mon voisin répare de vieux vélos dans son garage."),
    ("Spanish", "El tren llegó con media hora de retraso por culpa de la nieve."),
    ("Spanish", "Mi abuela cultiva tomates y pimientos en un pequeño huerto."),
    ("Spanish", "Los músicos tocaron en la plaza hasta la medianoche."),
    ("Spanish", "La biblioteca del pueblo recibe libros nuevos cada mes."),
    ("Spanish", "Después de la tormenta, el río subió casi un metro."),
    ("Italian", "Il negozio di biciclette apre alle nove e chiude alle sette."),
    ("Italian", "Abbiamo visitato un piccolo villaggio sulle colline vicino al lago."),
    ("Italian", "Il cuoco prepara la pasta fresca ogni mattina."),
]
ENGLISH_SENTENCES = [
    "The weather will be sunny tomorrow, with a light wind from the west.",
    "Please close the window before you leave the room.",
    "The meeting has been moved to Thursday afternoon.",
    "Our cat sleeps on the sofa most of the day.",
    "The library offers free courses for adults every spring.",
    "We need three more chairs for the guests.",
]


def _reflow(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def python_doc_paragraphs(min_chars: int = 200, max_chars: int = 600) -> list[str]:
    """Prose paragraphs of Python's reference docs (pydoc_data.topics), reflowed to single lines."""
    import pydoc_data.topics

    out = []
    for key in sorted(pydoc_data.topics.topics):
        for block in re.split(r"\n\s*\n", pydoc_data.topics.topics[key]):
            if block.startswith((" ", "\t")) or ">>>" in block:  # code and examples, not prose
                continue
            para = _reflow(block)
            if min_chars <= len(para) <= max_chars:
                out.append(para)
    return out


def stdlib_docstrings(max_chars: int = 400) -> list[tuple[str, str]]:
    """(module, first paragraph of its docstring), read from the source with ast: nothing is imported."""
    out = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_"):
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        try:
            doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        if doc:
            first = _reflow(doc.split("\n\n")[0])
            if 20 <= len(first) <= max_chars:
                out.append((name, first))
    return out


def compose_prompts(seed: int = 0) -> list[dict]:
    """Every candidate prompt, tagged with its source; deterministic for a seed."""
    rng = random.Random(seed)
    prompts: list[dict] = []

    def add(source: str, text: str) -> None:
        prompts.append({"source": source, "text": text})

    for subject in WRITING_SUBJECTS:
        for form in WRITING_FORMS:
            add("writing", form.format(subject))
    for role in ROLES:
        for form in ROLE_FORMS:
            add("roleplay", form.format(role))
    for concept in CONCEPTS:
        for form in CONCEPT_FORMS:
            add("stem-humanities-qa", form.format(concept))
    for task in CODING_TASKS:
        for form in CODING_FORMS:
            add("coding", form.format(task))
    for template in MATH_TEMPLATES:
        for _ in range(6):
            a, b, c = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
            add("math", template.format(a=a, b=b, c=c, d=a * rng.randint(5, 20), e=b * rng.randint(2, 6)))
    for _ in range(20):
        x, y, z = rng.sample(NONSENSE, 3)
        add("reasoning", f"Every {x[:-1]} is a {y[:-1]}, and no {y[:-1]} is a {z[:-1]}. "
                         f"Can a {x[:-1]} be a {z[:-1]}? Explain your answer.")
        p, q, r = rng.sample(NAMES, 3)
        add("reasoning", f"{p} is older than {q}, and {q} is older than {r}. Who is the youngest, "
                         f"and how do you know?")
    for lang, sentence in FOREIGN:
        add("translation", f"Translate {lang} to English: {sentence}")
        add("translation", f"What does this {lang} sentence mean in English? {sentence}")
    for sentence in ENGLISH_SENTENCES:
        for lang in ("French", "German", "Spanish"):
            add("translation", f"Translate English to {lang}: {sentence}")
    paragraphs = python_doc_paragraphs()
    rng.shuffle(paragraphs)
    doc_forms = [
        ("summarization", "Give a brief summary of this passage: {p}"),
        ("summarization", "Summarize in one sentence: {p}"),
        ("rag", "Context: {p} Question: What is the main point of this passage?"),
        ("rag", "Read the text and answer: which Python feature does it describe? Text: {p}"),
        ("extraction", "List the technical terms that appear in this text: {p}"),
        ("python-docs", "Explain this passage from the Python documentation in simple words: {p}"),
    ]
    for i, para in enumerate(paragraphs):
        source, form = doc_forms[i % len(doc_forms)]
        add(source, form.format(p=para))
    for name, doc in stdlib_docstrings():
        add("stdlib-docs", f"What is the Python module `{name}` used for? Its documentation begins: \"{doc}\"")
        add("stdlib-docs", f"Show a short example of using the Python standard library module `{name}`.")
    return prompts


def _shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(max(0, len(words) - n + 1))}


def benchmark_texts() -> list[str]:
    """Spec-Bench questions (when a copy is at hand) and the built-in mini prompts."""
    import os

    from specbench.inputs.tasks import MINI, load_jsonl_questions

    texts = [t for q in MINI for t in q.turns]
    for cand in (os.environ.get("SPECBENCH_QUESTIONS"), ROOT.parent / "shared/data/spec_bench/question.jsonl",
                 ROOT / "tests/fixtures/spec_bench_sample.jsonl"):
        if cand and Path(cand).is_file():
            texts += [t for q in load_jsonl_questions(cand) for t in q.turns]
            break
    return texts


def select_prompts(n: int, seed: int) -> tuple[list[dict], dict]:
    """n prompts, none overlapping the benchmark; a shuffled, source-balanced pick."""
    candidates = compose_prompts(seed)
    bench = set().union(*(_shingles(t) for t in benchmark_texts()))
    clean = [p for p in candidates if not (_shingles(p["text"]) & bench)]
    rng = random.Random(seed)
    rng.shuffle(clean)
    # Round-robin over sources so a small n still covers every kind of prompt.
    by_source: dict[str, list[dict]] = {}
    for p in clean:
        by_source.setdefault(p["source"], []).append(p)
    picked: list[dict] = []
    while len(picked) < n and any(by_source.values()):
        for src in sorted(by_source):
            if by_source[src] and len(picked) < n:
                picked.append(by_source[src].pop())
    stats = {"candidates": len(candidates), "dropped_for_benchmark_overlap": len(candidates) - len(clean),
             "selected": len(picked), "by_source": {}}
    for p in picked:
        stats["by_source"][p["source"]] = stats["by_source"].get(p["source"], 0) + 1
    return picked, stats


# ---------------------------------------------------------------------------------------------
# 2. self-distillation data: greedy answers + hidden states, cached per batch


@torch.inference_mode()
def greedy_answers(model, batch_ids: list[list[int]], max_new_tokens: int, eos: set[int], pad_id: int):
    """Batched greedy decoding with left padding. Returns per prompt (answer tokens, hidden states):
    hidden[i] is the last hidden state (after the final norm) of the row whose logits chose
    answer[i], i.e. the prompt's last position for i = 0."""
    device = model.device
    width = max(map(len, batch_ids))
    ids = torch.full((len(batch_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(batch_ids):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    from transformers import DynamicCache

    cache = DynamicCache()
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    tokens: list[list[int]] = [[] for _ in batch_ids]
    hiddens: list[list[torch.Tensor]] = [[] for _ in batch_ids]
    done = torch.zeros(len(batch_ids), dtype=torch.bool)
    step_ids, step_pos = ids, position
    lm_head = model.get_output_embeddings()
    for _ in range(max_new_tokens):
        out = model.model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                          **with_cache(model.model, cache), use_cache=True)
        h = out.last_hidden_state[:, -1]
        nxt = lm_head(h).argmax(-1)
        h_cpu, nxt_cpu = h.to(torch.float16).cpu(), nxt.cpu()
        for row in range(len(batch_ids)):
            if not done[row]:
                tokens[row].append(int(nxt_cpu[row]))
                hiddens[row].append(h_cpu[row])
                done[row] = int(nxt_cpu[row]) in eos
        if done.all():
            break
        step_ids = torch.where(done.to(device), torch.full_like(nxt, pad_id), nxt)[:, None]
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return [(torch.tensor(t, dtype=torch.int32), torch.stack(h)) for t, h in zip(tokens, hiddens)]


def make_data(args, model, tok, prompts: list[dict], cache_dir: Path) -> dict:
    """Generate (or reuse from the cache) every batch; returns timing and size figures."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    template = args.chat_template
    encoded = [prompt_ids(tok, [{"role": "user", "content": p["text"]}], template) for p in prompts]
    eos = set(eos_token_ids(model, tok))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    # Similar lengths in a batch keep left padding small; order is fixed by the seed.
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    t0, generated = time.time(), 0
    n_batches = math.ceil(len(order) / args.batch_size)
    for b in range(n_batches):
        shard = cache_dir / f"batch_{b:04d}.pt"
        if shard.is_file():
            continue
        idx = order[b * args.batch_size : (b + 1) * args.batch_size]
        tb = time.time()
        answers = greedy_answers(model, [encoded[i] for i in idx], args.max_new_tokens, eos, pad)
        torch.save({"prompt_index": idx, "tokens": [a[0] for a in answers], "hidden": [a[1] for a in answers]},
                   shard)
        n_tok = sum(len(a[0]) for a in answers)
        generated += n_tok
        print(f"  batch {b + 1}/{n_batches}: {n_tok} answer tokens in {time.time() - tb:.0f} s", flush=True)
    return {"generation_seconds": round(time.time() - t0, 1), "tokens_generated_this_run": generated,
            "batches": n_batches}


def load_rows(cache_dir: Path, num_heads: int, held_out: set[int]):
    """Training rows: hidden state at answer position t -> targets for heads 0..K-1 (token t+k+2).
    Split by prompt so held-out prompts never share an answer with training."""
    split = {"train": ([], []), "eval": ([], [])}
    answer_tokens = 0
    for shard in sorted(cache_dir.glob("batch_*.pt")):
        data = torch.load(shard, weights_only=True)
        for p_idx, toks, hid in zip(data["prompt_index"], data["tokens"], data["hidden"]):
            n = len(toks)
            answer_tokens += n
            targets = torch.full((n, num_heads), IGNORE, dtype=torch.long)
            for k in range(num_heads):
                # hid[i] chose toks[i]; head k at row i predicts toks[i + k + 1].
                if n > k + 1:
                    targets[: n - k - 1, k] = toks[k + 1 :].long()
            keep = targets[:, 0] != IGNORE  # rows with no target at all teach nothing
            xs, ys = split["eval" if p_idx in held_out else "train"]
            xs.append(hid[keep])
            ys.append(targets[keep])
    out = {"answer_tokens": answer_tokens}
    for name, (xs, ys) in split.items():
        out[name] = (torch.cat(xs) if xs else torch.empty(0), torch.cat(ys) if ys else torch.empty(0))
    return out


# ---------------------------------------------------------------------------------------------
# 3. training and 4. evaluation


def medusa_loss(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    logits = heads(x)  # (K, B, V)
    total, per_head = 0.0, []
    for k in range(heads.num_heads):
        valid = y[:, k] != IGNORE
        if not valid.any():
            per_head.append(float("nan"))
            continue
        ce = torch.nn.functional.cross_entropy(logits[k][valid].float(), y[valid, k])
        total = total + HEAD_WEIGHT**k * ce
        per_head.append(ce.item())
    return total, per_head


def train_heads(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor, args, device, log) -> list[dict]:
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(x) / args.train_batch_size)
    total = max(1, int(steps_per_epoch * args.epochs)) if args.max_steps is None else args.max_steps
    warmup = max(1, int(0.05 * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    gen = torch.Generator().manual_seed(args.seed)
    amp = device.type == "cuda" or args.amp == "bf16"
    history, step, t0 = [], 0, time.time()
    window: list[tuple[float, list[float]]] = []  # losses since the last log line
    while step < total:
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), args.train_batch_size):
            if step >= total:
                break
            idx = perm[i : i + args.train_batch_size]
            xb = x[idx].to(device=device, dtype=torch.float32)
            yb = y[idx].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss, per_head = medusa_loss(heads, xb, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            window.append((loss.item(), per_head))
            if step == 1 or step % args.log_every == 0 or step == total:
                # mean over the steps since the last line: one minibatch alone is noisy
                rec = {"step": step, "loss": round(sum(w[0] for w in window) / len(window), 4),
                       "ce_per_head": [round(sum(w[1][k] for w in window) / len(window), 4)
                                       for k in range(heads.num_heads)],
                       "seconds": round(time.time() - t0, 1)}
                window = []
                history.append(rec)
                log(f"  step {step}/{total}: loss {rec['loss']:.4f} per head {rec['ce_per_head']}")
    return history


@torch.inference_mode()
def head_accuracy(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor, device, batch: int = 256) -> dict:
    ce = torch.zeros(heads.num_heads)
    correct1 = torch.zeros(heads.num_heads)
    correct5 = torch.zeros(heads.num_heads)
    count = torch.zeros(heads.num_heads)
    for i in range(0, len(x), batch):
        xb = x[i : i + batch].to(device=device, dtype=torch.float32)
        yb = y[i : i + batch].to(device)
        logits = heads(xb)  # (K, B, V)
        top = logits.topk(5, dim=-1).indices
        for k in range(heads.num_heads):
            valid = yb[:, k] != IGNORE
            ce[k] += torch.nn.functional.cross_entropy(logits[k][valid], yb[valid, k], reduction="sum").item()
            hit = top[k][valid] == yb[valid, k, None]
            correct1[k] += hit[:, 0].sum().item()
            correct5[k] += hit.any(-1).sum().item()
            count[k] += valid.sum().item()
    return {"top1": [round(float(c / max(n, 1)), 4) for c, n in zip(correct1, count)],
            "top5": [round(float(c / max(n, 1)), 4) for c, n in zip(correct5, count)],
            "ce": [round(float(c / max(n, 1)), 4) for c, n in zip(ce, count)],
            "rows": [int(n) for n in count]}


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a conf/model/<name>.yaml name")
    ap.add_argument("--model-path", help="override the model config's path (hub id or local directory)")
    ap.add_argument("--out", required=True, help="directory for config.json + medusa_lm_head.safetensors")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", help="the frozen model's dtype")
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--num-layers", type=int, default=1)
    ap.add_argument("--own-projection", action="store_true",
                    help="train a vocabulary projection per head (published layout) instead of sharing lm_head")
    ap.add_argument("--num-prompts", type=int, default=480)
    ap.add_argument("--held-out", type=float, default=0.1, help="share of prompts kept for evaluation")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per generation batch")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (overrides --epochs)")
    ap.add_argument("--train-batch-size", type=int, default=64, help="rows (answer positions) per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--amp", choices=["bf16", "none"], default="bf16",
                    help="bfloat16 autocast for the heads (float32 master weights); always on with CUDA")
    ap.add_argument("--save-dtype", default="float16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--cache-dir", help="default: ~/.cache/specbench/medusa/<model>-<settings hash>")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    return ap.parse_args(argv)


def model_config(args) -> dict:
    from specbench.errors import SettingsError
    from specbench.inputs.models import named_model_config

    try:
        return named_model_config(args.model, args.model_path)
    except SettingsError as e:
        raise SystemExit(f"error: {e}; or --model hf --model-path <dir>") from None


def frozen_target(args):
    """The head trainers' common start (this script's and train_eagle.py's): threads and seed set, the
    target loaded frozen. Returns (model, tokenizer, its model config, device)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    mcfg = model_config(args)
    print(f"loading {args.model} on {device} ({args.dtype})", flush=True)
    model, tok = load_model(mcfg, device, dtype)
    model.requires_grad_(False)
    return model, tok, mcfg, device


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.time()
    model, tok, mcfg, device = frozen_target(args)
    args.chat_template = mcfg.get("chat_template", "auto")

    prompts, prompt_stats = select_prompts(args.num_prompts, args.seed)
    settings = {"model": args.model, "path": mcfg.get("path"), "dtype": args.dtype, "prompts": [p["text"] for p in prompts],
                "max_new_tokens": args.max_new_tokens, "template": args.chat_template}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    cache_dir = Path(args.cache_dir or cache_root() / "medusa" / f"{args.model}-{key}")
    print(f"{len(prompts)} prompts ({prompt_stats['dropped_for_benchmark_overlap']} candidates dropped for "
          f"overlap with benchmark questions); data cache {cache_dir}", flush=True)
    (cache_dir).mkdir(parents=True, exist_ok=True)
    (cache_dir / "prompts.json").write_text(json.dumps(prompts, indent=1))
    gen_stats = make_data(args, model, tok, prompts, cache_dir)

    rng = random.Random(args.seed + 1)
    held_out = set(rng.sample(range(len(prompts)), max(1, int(args.held_out * len(prompts)))))
    rows = load_rows(cache_dir, args.num_heads, held_out)
    (x_train, y_train), (x_eval, y_eval) = rows["train"], rows["eval"]
    print(f"rows: {len(x_train)} train, {len(x_eval)} held-out", flush=True)

    lm_head = model.get_output_embeddings().weight.detach()
    hidden, vocab = lm_head.shape[1], lm_head.shape[0]
    heads = MedusaHeads(args.num_heads, hidden, vocab, args.num_layers, shared_projection=not args.own_projection)
    heads.to(device)
    if args.own_projection:
        heads.init_projections_from(lm_head.float())
    else:
        heads.set_shared_projection(lm_head.float() if lm_head.dtype != torch.float32 else lm_head)
    untrained = head_accuracy(heads, x_eval, y_eval, device)
    print(f"untrained heads (identity ResBlock) held-out top-1 {untrained['top1']}", flush=True)

    t_train = time.time()
    history = train_heads(heads, x_train, y_train, args, device, lambda m: print(m, flush=True))
    train_seconds = time.time() - t_train

    info = {
        "command": "python scripts/train_medusa.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "base_model": args.model, "base_model_path": mcfg.get("path"), "dtype": args.dtype, "device": str(device),
        "prompt_sources": "Python's pydoc_data.topics, stdlib module docstrings (read with ast), composed "
                          "templates (scripts/train_medusa.py); none overlaps Spec-Bench or the mini prompts",
        "prompts": prompt_stats, "held_out_prompts": len(held_out),
        "max_new_tokens": args.max_new_tokens, "answer_tokens": rows["answer_tokens"],
        "train_rows": int(len(x_train)), "eval_rows": int(len(x_eval)),
        "epochs": args.epochs, "steps": history[-1]["step"] if history else 0, "train_batch_size": args.train_batch_size,
        "lr": args.lr, "amp": args.amp, "loss": "sum_k 0.8^k CE(head k, token t+k+2)",
        "first_loss": history[0] if history else None, "final_loss": history[-1] if history else None,
        "history": history, "generation": gen_stats,
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    out = save_heads(heads, args.out, resolve_dtype(args.save_dtype), base_model=args.model,
                     base_model_name_or_path=mcfg.get("path") or args.model)
    # Evaluate what was saved (float16 weights), reading it back as the drafter will.
    saved = load_heads(out).to(device)
    if saved.shared_projection:
        saved.set_shared_projection(lm_head.float() if lm_head.dtype != torch.float32 else lm_head)
    info["held_out_accuracy"] = {"trained": head_accuracy(saved, x_eval, y_eval, device), "untrained": untrained}
    (Path(out) / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"held-out top-1 per head: trained {info['held_out_accuracy']['trained']['top1']} "
          f"(untrained {untrained['top1']}); wrote {out}", flush=True)
    return info


if __name__ == "__main__":
    main()
