#!/usr/bin/env python
"""Build a REST datastore (token ids + suffix array) with a model's tokenizer.

Corpus sources (any mix):
  FILES/DIRS        .txt (one document per file, or per blank-line-separated block with
                    --split-paragraphs), .jsonl/.json, optionally gzipped (records with text, or
                    chat turns under data / messages / conversations, as UltraChat and ShareGPT
                    store them; every turn is a document), .yml/.yaml in chatterbot-corpus' layout
                    (one document per conversation); a directory is searched recursively for those.
                    The self-distilled chat corpus scripts/make_rest_corpus.py writes is such a jsonl.
  --dataset NAME    a Hugging Face `datasets` name (needs the hub), e.g. the UltraChat store that
                    REST and Spec-Bench use:  --dataset stingning/ultrachat --split train
  --python-docs     the reference text that ships with Python itself (pydoc_data.topics); the
                    earlier embedded store (smollm2-135m-pydoc) is built from this alone.
  --chatterbot LANG the dialog corpus of the PyPI package chatterbot-corpus (BSD-3-Clause; fetched
                    with `pip download` into the specbench cache), e.g. --chatterbot english.

--fraction F keeps the first F of every source's records (conversations) (store size studies);
--drop-benchmark-overlap drops every document sharing an 8-word window with a Spec-Bench question
or a built-in mini prompt (specbench/tools/training_data.py's filter).

Examples:
  # the embedded default store (data/rest/smollm2-135m-selfdistil)
  python scripts/build_rest_datastore.py --model smollm2-135m --drop-benchmark-overlap \\
      data/rest/corpora/smollm2-135m-selfdistil.jsonl.gz --out data/rest/smollm2-135m-selfdistil
  # the same + chatterbot's English dialogs (no better on Spec-Bench: data/rest/README.md)
  python scripts/build_rest_datastore.py --model smollm2-135m --drop-benchmark-overlap \\
      data/rest/corpora/smollm2-135m-selfdistil.jsonl.gz --chatterbot english --out ~/rest/smollm2-135m-chat
  python scripts/build_rest_datastore.py --model smollm2-135m --python-docs --out data/rest/smollm2-135m-pydoc
  python scripts/build_rest_datastore.py --model vicuna-7b --dataset stingning/ultrachat --out ~/rest/vicuna-ultrachat
  python scripts/build_rest_datastore.py --tokenizer /path/to/hf-model my_corpus/ --out my_store
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import subprocess
import sys
import zipfile
import time
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.drafting.datastore import build_datastore, require_divsufsort, vocab_sha256

ROOT = Path(__file__).resolve().parents[1]

TEXT_SUFFIXES = {".txt", ".md", ".text"}
JSON_SUFFIXES = {".jsonl", ".json"}
YAML_SUFFIXES = {".yml", ".yaml"}
CHATTERBOT = "chatterbot-corpus==1.3.3"  # BSD-3-Clause, (c) 2017 Gunther Cox


def _kind(path: Path) -> str:
    """The file's suffix, looking through a trailing .gz."""
    sfx = path.suffixes
    return sfx[-2] if len(sfx) >= 2 and sfx[-1] == ".gz" else path.suffix


def _read(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8", errors="replace")


def texts_from_record(rec) -> list[str]:
    """Every text in one record: a string, {'text': ...}, or chat turns (UltraChat's 'data' list,
    'messages' / 'conversations' lists of {'content'|'value': ...})."""
    if isinstance(rec, str):
        return [rec]
    if isinstance(rec, list):
        return [t for r in rec for t in texts_from_record(r)]
    if not isinstance(rec, dict):
        return []
    for key in ("data", "messages", "conversations", "turns"):
        if key in rec:
            return texts_from_record(rec[key])
    for key in ("text", "content", "value", "output", "response"):
        if isinstance(rec.get(key), str):
            return [rec[key]]
    return []


def reflow(text: str) -> str:
    """Join hard-wrapped prose lines into paragraphs; indented (code) blocks keep their lines."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        if all(ln and not ln[0].isspace() for ln in lines) and not re.fullmatch(r"[*=\-]+", lines[-1].strip()):
            out.append(" ".join(ln.strip() for ln in lines))
        else:
            out.append(block)
    return "\n\n".join(out)


def python_docs() -> list[str]:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    return [reflow(topics[k]) for k in sorted(topics)]


def yaml_texts(raw: str, where: str) -> list[str]:
    """chatterbot-corpus' layout: {categories: [...], conversations: [[turn, turn, ...], ...]};
    one document per conversation, its turns one a line."""
    import yaml

    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise SystemExit(f"{where}: not valid YAML ({e})")
    convs = data.get("conversations", []) if isinstance(data, dict) else data
    return ["\n".join(str(t) for t in (c if isinstance(c, list) else [c])) for c in convs or []]


def file_records(path: Path, split_paragraphs: bool) -> list[list[str]]:
    """The file's records (a json record, a conversation, a text document), each as its texts."""
    kind = _kind(path)
    if kind in JSON_SUFFIXES:
        raw = _read(path)
        try:
            recs = json.loads(raw) if kind == ".json" else [json.loads(ln) for ln in raw.splitlines() if ln.strip()]
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}: not valid JSON ({e})")
        return [texts_from_record(r) for r in (recs if isinstance(recs, list) else [recs])]
    if kind in YAML_SUFFIXES:
        return [[t] for t in yaml_texts(_read(path), str(path))]
    text = _read(path)
    return [[t] for t in re.split(r"\n\s*\n", text) if t.strip()] if split_paragraphs else [[text]]


def file_texts(path: Path, split_paragraphs: bool) -> list[str]:
    return [t for rec in file_records(path, split_paragraphs) for t in rec]


def chatterbot_texts(lang: str) -> list[str]:
    """The conversations of chatterbot-corpus' LANG files, read from its wheel (pip download,
    cached under the specbench cache)."""
    from specbench.inputs.models import cache_root

    wheel_dir = cache_root() / "wheels" / "chatterbot-corpus"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    pkg, version = CHATTERBOT.split("==")
    wheels = sorted(wheel_dir.glob(f"chatterbot_corpus-{version}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheel_dir), CHATTERBOT]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(wheel_dir.glob(f"chatterbot_corpus-{version}-*.whl"))
        if done.returncode != 0 or not wheels:
            raise SystemExit(f"could not download {CHATTERBOT} from PyPI: {done.stderr.strip()[-300:]}")
    texts = []
    with zipfile.ZipFile(wheels[0]) as zf:
        members = sorted(m for m in zf.namelist()
                         if m.startswith(f"chatterbot_corpus/data/{lang}/") and _kind(Path(m)) in YAML_SUFFIXES)
        if not members:
            raise SystemExit(f"{CHATTERBOT} has no language '{lang}'")
        for m in members:
            texts += yaml_texts(zf.read(m).decode("utf-8"), f"{wheels[0].name}:{m}")
    return texts


def _head(records: list, fraction: float) -> list:
    return records if fraction >= 1 else records[: math.ceil(fraction * len(records))]


def corpus_texts(args):
    """Every document of every source, in order; --fraction keeps the first part of each source's
    records (a json record's turns stay together)."""
    frac = args.fraction
    if args.python_docs:
        yield from _head(python_docs(), frac)
    for src in args.sources:
        p = Path(src)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*")
                           if f.is_file() and _kind(f) in TEXT_SUFFIXES | JSON_SUFFIXES | YAML_SUFFIXES)
            if not files:
                raise SystemExit(f"{p}: no .txt/.md/.jsonl/.json/.yml files inside")
        elif p.is_file():
            files = [p]
        else:
            raise SystemExit(f"corpus source '{src}' not found")
        recs = [rec for f in files for rec in file_records(f, args.split_paragraphs)]
        yield from (t for rec in _head(recs, frac) for t in rec)
    if args.chatterbot:
        yield from _head(chatterbot_texts(args.chatterbot), frac)
    if args.dataset:
        from datasets import load_dataset

        ds = load_dataset(args.dataset, args.dataset_config, split=args.split)
        for i, rec in enumerate(ds):
            if args.max_records and i >= args.max_records:
                break
            yield from texts_from_record(rec if not args.text_field else rec[args.text_field])


def load_tokenizer(args):
    from transformers import AutoTokenizer

    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer), args.tokenizer
    from omegaconf import OmegaConf

    cfg_file = ROOT / "conf" / "model" / f"{args.model}.yaml"
    if not cfg_file.is_file():
        raise SystemExit(f"no model config conf/model/{args.model}.yaml; give --model NAME or --tokenizer PATH")
    cfg = OmegaConf.to_container(OmegaConf.load(cfg_file))
    if cfg.get("path") and not cfg.get("gguf"):
        return AutoTokenizer.from_pretrained(cfg["path"]), cfg["name"]
    import torch

    from specbench.inputs.models import load_model  # GGUF models: the tokenizer comes with the weights

    _, tok = load_model(cfg, torch.device("cpu"), torch.float32)
    return tok, cfg["name"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", help="text/jsonl files or directories")
    ap.add_argument("--out", required=True, help="output directory")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="a model config name from conf/model (e.g. smollm2-135m)")
    g.add_argument("--tokenizer", help="a tokenizer directory or hub id")
    ap.add_argument("--dataset", help="a `datasets` name, e.g. stingning/ultrachat")
    ap.add_argument("--dataset-config", default=None)
    ap.add_argument("--split", default="train")
    ap.add_argument("--text-field", default=None, help="record field holding the text or turns")
    ap.add_argument("--max-records", type=int, default=0, help="stop after this many dataset records")
    ap.add_argument("--python-docs", action="store_true", help="add Python's bundled reference text")
    ap.add_argument("--chatterbot", metavar="LANG", help=f"add the LANG conversations of {CHATTERBOT} (e.g. english)")
    ap.add_argument("--split-paragraphs", action="store_true", help="text files: one document per paragraph")
    ap.add_argument("--fraction", type=float, default=1.0, help="keep the first F of every source's records")
    ap.add_argument("--drop-benchmark-overlap", action="store_true",
                    help="drop documents sharing an 8-word window with a Spec-Bench question or a mini prompt")
    args = ap.parse_args(argv)
    if not (args.sources or args.dataset or args.python_docs or args.chatterbot):
        ap.error("give corpus files/directories, --dataset NAME, --python-docs or --chatterbot LANG")
    if not 0 < args.fraction <= 1:
        ap.error("--fraction must lie in (0, 1]")
    require_divsufsort()  # before the model loads, not after

    tok, tok_name = load_tokenizer(args)
    t0 = time.perf_counter()
    n_texts = n_dropped = 0
    bench = None
    if args.drop_benchmark_overlap:
        from specbench.tools.training_data import benchmark_texts, shingles

        bench = set().union(*(shingles(t) for t in benchmark_texts()))

    def docs():
        nonlocal n_texts, n_dropped
        for text in corpus_texts(args):
            if bench is not None and shingles(text) & bench:
                n_dropped += 1
                continue
            n_texts += 1
            yield tok(text, add_special_tokens=False).input_ids

    desc = " + ".join(filter(None, ["python pydoc_data.topics " + sys.version.split()[0] if args.python_docs else "",
                                    *args.sources, f"{CHATTERBOT} {args.chatterbot}" if args.chatterbot else "",
                                    args.dataset or ""]))
    extra = {"fraction": args.fraction} if args.fraction < 1 else {}
    if bench is not None:
        extra["dropped_for_benchmark_overlap"] = 0  # filled in below
    # the model's name and the vocabulary's hash let REST refuse the store on another tokenizer
    meta = build_datastore(docs(), args.out, vocab_size=len(tok), tokenizer=tok_name, corpus=desc, extra_meta=extra,
                           model=args.model or "", vocab_hash=vocab_sha256(tok))
    if bench is not None:
        meta["dropped_for_benchmark_overlap"] = n_dropped
        (Path(args.out) / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    dt = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in Path(args.out).iterdir())
    print(f"wrote {args.out}: {meta['n_tokens']:,} tokens from {n_texts:,} texts"
          + (f" ({n_dropped} dropped for benchmark overlap)" if bench is not None else "")
          + f", {size / 2**20:.2f} MiB, built in {dt:.1f} s")
    return meta


if __name__ == "__main__":
    try:
        main()
    except SpecbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
