"""Spec-Bench answer files (``data/spec_bench/model_answer/*.jsonl``), both ways.

Spec-Bench (hemingkx/Spec-Bench, ``evaluation/eval.py``) writes one JSON line per question::

    {"question_id", "category", "answer_id", "model_id",
     "choices": [{"index": 0, "turns": [text per turn], "decoding_steps": [per turn],
                  "new_tokens": [per turn], "wall_time": [per turn], "accept_lengths": [...]}],
     "tstamp"}

``accept_lengths`` is ONE flat list for the whole question (eval.py extends it turn after turn),
not a list per turn: ``evaluation/speed.py`` pools it with ``np.mean``, which a ragged nested list
would break. The AR reference is a file of its own, named ``<model>-vanilla-<dtype>-temp-<T>``.

Why both ways: exporting lets Spec-Bench's own ``speed.py`` / ``equal.py`` (and anyone's scripts
written for them) read our runs; importing puts answer files people already have (EAGLE, Hydra,
SpS, ...) into our results layout, so ``collect`` / ``tables`` / ``plots`` show them beside our
methods with the same definitions. An export followed by an import gives back the same per-question
figures, so tables from the imported run equal the original's.

One addition to Spec-Bench's layout: each choice also carries ``prefill_time`` (per turn), so the
decode-only figures survive the round trip. Spec-Bench's scripts read keys by name and ignore it.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path

from specbench.run import metrics
from specbench.run.lossless import tally
from specbench.run.results_io import write_json_atomic
from specbench.inputs.questions import MT_BENCH_CATEGORIES, SUBTASKS, json_objects, subtask_of

# speed.py's task names, in the order it prints them ("mt_bench" is our "mt").
SPECBENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "overall")
TASK_TO_SUBTASK = {"mt_bench": "mt", **{s: s for s in SUBTASKS if s != "mt"}, "overall": "overall"}
BASELINE_NAME = "vanilla"  # Spec-Bench's name for AR in model ids (eval.sh)
REQUIRED_CHOICE_KEYS = ("turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths")
DEFAULT_QUESTIONS = Path("../shared/data/spec_bench/question.jsonl")
_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # shortuuid's, 22 characters
_MODEL_ID_SETTINGS = re.compile(r"-(float16|bfloat16|float32|float64)(?:-temp-(\d+(?:\.\d+)?))?$")


class FormatError(ValueError):
    """A malformed answer file; the message names the file and line."""


# ---------------------------------------------------------------- export


def model_id(identity: dict, method: str) -> str:
    """Spec-Bench's naming, ``<model>-<method>-<dtype>-temp-<T>`` (AR is 'vanilla'), so exported files
    sit beside Spec-Bench's own and its scripts' defaults read naturally. Sampling filters, which
    Spec-Bench has none of, are appended (-k<top_k>, -p<top_p>) so two such runs never share a name."""
    name = BASELINE_NAME if method == "ar" else method
    out = f"{identity.get('model')}-{name}-{identity.get('dtype')}-temp-{float(identity.get('temperature') or 0.0)}"
    if identity.get("top_k"):
        out += f"-k{identity['top_k']}"
    if identity.get("top_p") not in (None, 1, 1.0):
        out += f"-p{identity['top_p']:g}"
    return out


def answer_id(model: str, question_id, salt: str = "") -> str:
    """A shortuuid-looking id (Spec-Bench draws a random one) made from a hash instead, so exporting
    the same run twice gives the same file; salt (the run's finish time) keeps repeats apart."""
    n = int.from_bytes(hashlib.sha256(f"{model}|{salt}|{question_id}".encode()).digest()[:16], "big")
    chars = []
    for _ in range(22):
        n, r = divmod(n, len(_ALPHABET))
        chars.append(_ALPHABET[r])
    return "".join(chars)


def iso_to_tstamp(finished: str | None) -> float:
    """Spec-Bench stamps each line with time.time(); we have the run's finish time only (local,
    naive), read as UTC so the export does not depend on the exporting machine's time zone."""
    if not finished:
        return 0.0
    return datetime.fromisoformat(finished).replace(tzinfo=timezone.utc).timestamp()


def record_to_answer(record: dict, model: str, ans_id: str, tstamp: float) -> dict:
    """One of our answer records -> one Spec-Bench line. Values an import kept (record['specbench'])
    win over the made-up ones, so import -> export gives back the file that was imported."""
    kept = record.get("specbench", {})
    turns = record["turns"]
    choice = {"index": 0, "turns": [t["output"] for t in turns],
              "decoding_steps": [t["decoding_steps"] for t in turns],
              "new_tokens": [t["new_tokens"] for t in turns],
              "wall_time": [t["wall_time"] for t in turns],
              "accept_lengths": [a for t in turns for a in t["accept_lengths"]]}
    if all("prefill_time" in t for t in turns):
        choice["prefill_time"] = [t["prefill_time"] for t in turns]
    return {"question_id": record["question_id"], "category": record["category"],
            "answer_id": kept.get("answer_id", ans_id), "model_id": kept.get("model_id", model),
            "choices": [choice], "tstamp": kept.get("tstamp", tstamp)}


def run_answers(run) -> tuple[str, list[dict], str | None, list[dict]]:
    """A loaded run (specbench.report.collect.Run) -> (model id, lines, baseline model id, baseline
    lines). An AR run is its own baseline: its baseline part is None / []."""
    source = (run.summary or {}).get("source") or {}
    ident = dict(run.identity)
    ident.setdefault("model", (run.summary or {}).get("model"))
    mid = source.get("model_id") or model_id(ident, run.method)
    salt = (run.summary or {}).get("finished") or ""
    ts = iso_to_tstamp((run.summary or {}).get("finished"))
    lines = [record_to_answer(r, mid, answer_id(mid, r["question_id"], salt), ts) for r in run.records]
    if run.method == "ar" or not run.baseline:
        return mid, lines, None, []
    bid = source.get("baseline_model_id") or model_id(ident, "ar")
    ids = {r["question_id"] for r in run.records}
    base = [record_to_answer(b, bid, answer_id(bid, b["question_id"], salt), ts)
            for b in run.baseline if b["question_id"] in ids]
    return mid, lines, bid, base


def write_answer_file(path: Path, lines: list[dict]) -> Path:
    """json.dumps with its defaults, one line each, as eval.py writes them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return path


def export_run(run_dir: str | Path, out_dir: str | Path) -> dict:
    """Write <out>/<model_id>.jsonl and, for a method run, the AR baseline's file beside it.
    Returns {'answers': path, 'baseline': path or None}."""
    from specbench.report.collect import load_run  # collect imports tables; keep this module light

    run = load_run(run_dir)
    if not run.records:
        raise FormatError(f"{run_dir}: no answers to export (answers.jsonl is empty or missing)")
    mid, lines, bid, base = run_answers(run)
    out = Path(out_dir)
    paths = {"answers": write_answer_file(out / f"{mid}.jsonl", lines), "baseline": None}
    if bid:
        paths["baseline"] = write_answer_file(out / f"{bid}.jsonl", base)
    return paths


# ---------------------------------------------------------------- reading answer files


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_answer_file(path: str | Path) -> list[dict]:
    """Validated lines of a Spec-Bench answer file, each with '_line' (its line number).

    A question answered twice (a resumed Spec-Bench run appends) keeps its last answer, as
    Spec-Bench's reorg_answer_file does, at the place of its first."""
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    by_id: dict = {}
    with path.open(encoding="utf-8") as f:
        for lineno, d in json_objects(path, f, FormatError):
            where = f"{path}:{lineno}"
            if not isinstance(d.get("question_id"), (str, int)) or isinstance(d.get("question_id"), bool):
                raise FormatError(f"{where}: missing field question_id (a string or an integer)")
            choices = d.get("choices")
            if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                raise FormatError(f"{where}: 'choices' must be a non-empty list of objects")
            c = choices[0]
            missing = [k for k in REQUIRED_CHOICE_KEYS if k not in c]
            if missing:
                raise FormatError(f"{where}: choices[0] lacks {', '.join(missing)}")
            turns = c["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise FormatError(f"{where}: choices[0].turns must be a non-empty list of strings")
            for k in ("decoding_steps", "new_tokens", "wall_time", "prefill_time"):
                if k not in c:
                    continue
                v = c[k]
                if not isinstance(v, list) or len(v) != len(turns) or not all(_is_number(x) and x >= 0 for x in v):
                    raise FormatError(f"{where}: choices[0].{k} must be {len(turns)} non-negative number(s), "
                                      f"one per turn, got {json.dumps(v)[:80]}")
            if not sum(c["wall_time"]) > 0:
                raise FormatError(f"{where}: choices[0].wall_time adds up to 0; speeds divide by it")
            acc = c["accept_lengths"]
            flat = isinstance(acc, list) and all(_is_number(a) for a in acc)
            nested = (isinstance(acc, list) and len(acc) == len(turns)  # lenient: one list per turn
                      and all(isinstance(t, list) and all(_is_number(a) for a in t) for t in acc))
            if not (flat or nested):
                raise FormatError(f"{where}: choices[0].accept_lengths must be a list of numbers")
            d["_line"] = lineno
            by_id[d["question_id"]] = d  # a repeated id keeps the first one's place, the last one's answer
    if not by_id:
        raise FormatError(f"{path}: no answers in file")
    return list(by_id.values())


def split_accepts(accepts: list, steps: list) -> tuple[list[list], bool]:
    """The flat accept_lengths list -> one list per turn, and whether the split is known.

    eval.py writes the turns' lists one after another and ``decoding_steps`` per turn; where the
    steps add up to the list's length (our engine; most Spec-Bench methods) they split it exactly.
    Otherwise (e.g. SpS reports idx+1 steps) everything stays on the first turn: MAT pools every
    step, so no figure depends on the split."""
    if accepts and isinstance(accepts[0], list):
        return [list(a) for a in accepts], True
    if sum(steps) == len(accepts) and all(isinstance(s, int) for s in steps):
        out, i = [], 0
        for s in steps:
            out.append(list(accepts[i:i + s]))
            i += s
        return out, True
    return [list(accepts)] + [[] for _ in steps[1:]], False


def load_questions(path: str | Path | None) -> dict:
    """question_id -> {'category', 'turns'} from a Spec-Bench question.jsonl (empty without one)."""
    if path is None:
        return {}
    from specbench.inputs.tasks import load_jsonl_questions

    try:
        qs = load_jsonl_questions(path)
    except (FileNotFoundError, ValueError) as e:
        raise FormatError(str(e)) from None
    return {q.question_id: {"category": q.category, "turns": q.turns} for q in qs}


def answer_to_record(ans: dict, method: str, questions: dict, path: Path) -> dict:
    """One Spec-Bench line -> one of our answer records (no token ids: Spec-Bench keeps none).

    The category comes from the line (what speed.py filters on), else from the question file; the
    subtask is Spec-Bench's column for it (specbench.inputs.tasks.subtask_of)."""
    where = f"{path}:{ans['_line']}"
    c = ans["choices"][0]
    q = questions.get(ans["question_id"])
    category = ans.get("category") or (q or {}).get("category")
    if not category:
        raise FormatError(f"{where}: question {ans['question_id']!r} has no category, and no question file "
                          f"(--questions) names it")
    if q is not None and len(q["turns"]) != len(c["turns"]):
        raise FormatError(f"{where}: question {ans['question_id']!r} has {len(c['turns'])} answer turn(s) but "
                          f"{len(q['turns'])} turn(s) in the question file; is it the right question file?")
    per_turn, known = split_accepts(c["accept_lengths"], c["decoding_steps"])
    turns = []
    for i, text in enumerate(c["turns"]):
        t = {"output": text, "new_tokens": c["new_tokens"][i], "wall_time": c["wall_time"][i]}
        if "prefill_time" in c:
            t["prefill_time"] = c["prefill_time"][i]
        t.update(decoding_steps=c["decoding_steps"][i], accept_lengths=per_turn[i])
        turns.append(t)
    rec = {"question_id": ans["question_id"], "category": category, "subtask": subtask_of(category),
           "method": method, "turns": turns, "lossless": {"status": "unchecked"},
           "specbench": {k: ans[k] for k in ("answer_id", "model_id", "tstamp") if k in ans}}
    if not known:
        rec["specbench"]["accept_lengths_split"] = "unknown"
    return rec


def text_check(record: dict, base: dict | None) -> dict:
    """equal.py's comparison (the turns' texts, per question rather than per file): with no token
    ids, equal texts are all an imported run can show. A difference cannot be told apart into a
    numeric tie or a bug without the model, so it is 'text_differs', counted as checked, not exact."""
    if base is None:
        return {"status": "unchecked"}
    for i, (a, b) in enumerate(zip(base["turns"], record["turns"])):
        if a["output"] != b["output"]:
            pos = next((j for j, (x, y) in enumerate(zip(a["output"], b["output"])) if x != y),
                       min(len(a["output"]), len(b["output"])))
            return {"status": "text_differs", "basis": "text", "turn": i, "char_position": pos}
    if len(base["turns"]) != len(record["turns"]):
        return {"status": "text_differs", "basis": "text", "turn": min(len(base["turns"]), len(record["turns"])),
                "char_position": 0}
    return {"status": "exact", "basis": "text"}


# ---------------------------------------------------------------- import


def parse_model_id(mid: str | None) -> dict:
    """dtype and temperature from Spec-Bench's '...-<dtype>-temp-<T>' naming, when the id has them."""
    m = _MODEL_ID_SETTINGS.search(mid or "")
    if not m:
        return {}
    out = {"dtype": m.group(1)}
    if m.group(2) is not None:
        out["temperature"] = float(m.group(2))
    return out


def _iso(tstamps: list) -> str | None:
    ts = [t for t in tstamps if _is_number(t)]
    return datetime.fromtimestamp(max(ts), timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") if ts else None


def imported_summary(identity: dict, records: list[dict], base: list[dict], source: dict) -> dict:
    """summary.json for an imported run: the runner's figures that answers alone determine.
    Decode-only figures need prefill times, which only our own exports carry."""
    ids = {r["question_id"] for r in records}
    base = [b for b in base if b["question_id"] in ids]
    decode = all("prefill_time" in t for r in (*records, *base) for t in r["turns"])
    checks = [r["lossless"] for r in records if r["lossless"]["status"] != "unchecked"]
    return {
        "method": identity["method"], "method_params": {}, "model": identity["model"],
        "task": identity["task"], "temperature": identity["temperature"], "top_k": 0, "top_p": 1.0,
        "dtype": identity["dtype"], "device": identity["device"], "max_new_tokens": identity["max_new_tokens"],
        "questions": len(records),
        "new_tokens": sum(t["new_tokens"] for r in records for t in r["turns"]),
        "wall_time": sum(t["wall_time"] for r in records for t in r["turns"]),
        "tokens_per_s": metrics.tokens_per_s(records),
        "decode_tokens_per_s": metrics.tokens_per_s(records, decode_only=True) if decode else None,
        "mat": metrics.mat(records),
        "subtask_mat": {s: metrics.mat([r for r in records if r["subtask"] == s]) for s in metrics.subtasks(records)},
        "baseline": "imported" if base else None,
        "baseline_tokens_per_s": metrics.tokens_per_s(base) if base else None,
        "speedup": metrics.speedup(records, base) if base else None,
        "decode_speedup": metrics.speedup(records, base, decode_only=True) if base and decode else None,
        "lossless": tally(checks),
        "lossless_details": [dict(r["lossless"], question_id=r["question_id"]) for r in records
                             if r["lossless"]["status"] not in ("exact", "unchecked")],
        "finished": _iso([r["specbench"].get("tstamp") for r in records]),
        "source": source,
    }


def import_dir_name(method: str, temperature: float, max_new_tokens: int | None) -> str:
    """'imported-<method>-t<T>[-m<M>]': not '<method>-...', so collect never pairs an imported run
    with an AR run of ours from the sibling directory (other hardware); its AR is its own file."""
    return f"imported-{method}-t{temperature:g}" + (f"-m{max_new_tokens}" if max_new_tokens else "")


def import_answers(answers: str | Path, out_root: str | Path, method: str, model: str,
                   baseline: str | Path | None = None, questions: str | Path | None = None,
                   temperature: float | None = None, dtype: str | None = None, task: str = "spec_bench",
                   device: str | None = None, max_new_tokens: int | None = None,
                   overwrite: bool = False) -> Path:
    """Spec-Bench answer file(s) -> a run directory under out_root that collect/tables/plots read:
    run_config.json, answers.jsonl, baseline_answers.jsonl (when a baseline is given), summary.json.

    temperature and dtype default to what the model id says (Spec-Bench's naming), else 0.0 and
    'unknown'. At temperature 0 with a baseline, each question gets equal.py's text comparison;
    otherwise (sampling: texts legitimately differ) the lossless check is 'unchecked'."""
    answers = Path(answers)
    qs = load_questions(questions)
    lines = read_answer_file(answers)
    recs = [answer_to_record(a, method, qs, answers) for a in lines]
    base_recs = []
    if baseline is not None:
        baseline = Path(baseline)
        base_recs = [answer_to_record(a, "ar", qs, baseline) for a in read_answer_file(baseline)]
    parsed = parse_model_id(lines[0].get("model_id"))
    temperature = float(temperature if temperature is not None else parsed.get("temperature", 0.0))
    dtype = dtype or parsed.get("dtype") or "unknown"
    if temperature == 0 and base_recs and method != "ar":
        by_id = {b["question_id"]: b for b in base_recs}
        for r in recs:
            r["lossless"] = text_check(r, by_id.get(r["question_id"]))
    identity = {"model": model, "model_path": None, "task": task, "task_path": str(questions) if questions else None,
                "subtasks": None, "per_subtask": None, "limit": None, "max_new_tokens": max_new_tokens,
                "temperature": temperature, "top_k": 0, "top_p": 1.0, "dtype": dtype,
                "device": device or "unknown", "seed": None, "method": method, "method_params": {}}
    source = {"kind": "imported", "format": "spec_bench", "answers": str(answers),
              "baseline": str(baseline) if baseline is not None else None,
              "questions": str(questions) if questions else None,
              "model_id": lines[0].get("model_id"),
              "baseline_model_id": base_recs[0]["specbench"]["model_id"] if base_recs else None}
    config = {"method": {"name": method}, "model": {"name": model}, "task": {"name": task},
              "max_new_tokens": max_new_tokens, "temperature": temperature, "dtype": dtype,
              "device_name": device or "unknown", "baseline": "imported" if base_recs else None,
              "repeat": 0, "source": source}
    out = Path(out_root) / model / task / import_dir_name(method, temperature, max_new_tokens)
    if (out / "answers.jsonl").exists() and not overwrite:
        raise FileExistsError(f"{out} already holds answers; pass --overwrite or another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "run_config.json", {"identity": identity, "config": config})
    _write_jsonl(out / "answers.jsonl", recs)
    if base_recs:
        _write_jsonl(out / "baseline_answers.jsonl", base_recs)
    elif (out / "baseline_answers.jsonl").exists():
        (out / "baseline_answers.jsonl").unlink()
    write_json_atomic(out / "summary.json", imported_summary(identity, recs, base_recs, source))
    return out


def _write_jsonl(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


# ---------------------------------------------------------------- Spec-Bench's own figures


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _flat(accepts: list) -> list:
    return [a for x in accepts for a in (x if isinstance(x, list) else [x])]


def _select(lines: list[dict], task: str) -> list[dict]:
    """speed.py's filter: 'overall' all, 'mt_bench' MT-bench's eight categories, else category == task."""
    if task == "overall":
        return lines
    if task == "mt_bench":
        return [d for d in lines if d["category"] in MT_BENCH_CATEGORIES]
    return [d for d in lines if d["category"] == task]


def specbench_speed_report(method_file: str | Path, baseline_file: str | Path, tokenizer=None) -> dict:
    """What Spec-Bench's evaluation/speed.py prints, per task, from the two answer files alone.

    speed.py, per task (each file filtered on its own, no matching of question ids):
    - method speed of a question = sum(new_tokens) / sum(wall_time) over its turns (choices[0]);
    - '#Mean accepted tokens' = np.mean of every accept_lengths entry of the method file, pooled;
    - baseline speed of a question = tokens / sum(wall_time), tokens = sum over turns of
      len(tokenizer(text).input_ids) - 1: it re-tokenizes the baseline's texts (dropping one token
      for BOS) instead of reading new_tokens. Pass ``tokenizer`` (a Hugging Face tokenizer or any
      callable returning an object with .input_ids) for exactly that; without one the baseline's
      new_tokens are used, which is what our own figures use;
    - speedup = mean(method speeds) / mean(baseline speeds); 'overall' is over every question.
    Returns {task: {'mean_accepted_tokens', 'tokens_per_second', 'tokens_per_second_baseline',
    'speedup', 'questions'}}; a task with no questions in either file is left out.
    """
    meth, base = read_answer_file(method_file), read_answer_file(baseline_file)
    for path, lines in ((method_file, meth), (baseline_file, base)):
        for d in lines:
            if "category" not in d:
                raise FormatError(f"{path}:{d['_line']}: no category (speed.py filters on it)")

    def base_tokens(c):
        if tokenizer is None:
            return sum(c["new_tokens"])
        return sum(len(tokenizer(text).input_ids) - 1 for text in c["turns"])

    report = {}
    for task in SPECBENCH_TASKS:
        m, b = _select(meth, task), _select(base, task)
        if not m or not b:
            continue
        speeds = [sum(d["choices"][0]["new_tokens"]) / sum(d["choices"][0]["wall_time"]) for d in m]
        accepts = [a for d in m for a in _flat(d["choices"][0]["accept_lengths"])]
        speeds0 = [base_tokens(d["choices"][0]) / sum(d["choices"][0]["wall_time"]) for d in b]
        report[task] = {"mean_accepted_tokens": _mean(accepts), "tokens_per_second": _mean(speeds),
                        "tokens_per_second_baseline": _mean(speeds0),
                        "speedup": _mean(speeds) / _mean(speeds0), "questions": len(m)}
    return report


def format_speed_report(report: dict) -> str:
    """The report in speed.py's printed layout."""
    out = []
    for task, r in report.items():
        out += ["=" * 30 + " Task:  " + task + " " + "=" * 30,
                f"#Mean accepted tokens:  {r['mean_accepted_tokens']}",
                f"Tokens per second:  {r['tokens_per_second']}",
                f"Tokens per second for the baseline:  {r['tokens_per_second_baseline']}",
                f"Speedup ratio:  {r['speedup']}"]
    return "\n".join(out) + "\n"
