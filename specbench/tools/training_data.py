"""What the head trainers (scripts/train_medusa.py, train_eagle.py) and the REST corpus
(scripts/make_rest_corpus.py) start from: prompts that are not benchmark questions, composed offline
(Python's reference docs, the standard library's docstrings read with `ast`, templates of our own for
the chat categories) with any prompt sharing an 8-word window with a Spec-Bench question or a `mini`
prompt dropped; the frozen target; its greedy answers with the last hidden state at every position
(self-distillation)."""

from __future__ import annotations

import ast
import importlib.util
import random
import re
import sys
from pathlib import Path

import torch

from specbench.decoding.kv_cache import with_cache
from specbench.inputs.models import load_model, resolve_device, resolve_dtype

ROOT = Path(__file__).resolve().parents[2]



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

    for source, items, forms in (("writing", WRITING_SUBJECTS, WRITING_FORMS), ("roleplay", ROLES, ROLE_FORMS),
                                 ("stem-humanities-qa", CONCEPTS, CONCEPT_FORMS),
                                 ("coding", CODING_TASKS, CODING_FORMS)):
        for item in items:
            for form in forms:
                add(source, form.format(item))
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


def shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
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
    bench = set().union(*(shingles(t) for t in benchmark_texts()))
    clean = [p for p in candidates if not (shingles(p["text"]) & bench)]
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


# -- self-distillation: greedy answers and hidden states --------------------------------------------


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


def model_config(args) -> dict:
    from specbench.errors import SettingsError
    from specbench.inputs.models import named_model_config

    try:
        return named_model_config(args.model, args.model_path)
    except SettingsError as e:
        raise SystemExit(f"error: {e}; or --model hf --model-path <dir>") from None


def frozen_target(args):
    """The head trainers' common start (train_medusa.py's and train_eagle.py's): threads and seed set, the
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
