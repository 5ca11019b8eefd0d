"""Where a trained draft head lives and how its files are read: Medusa's heads and EAGLE's head alike.

A checkpoint is a directory of config.json and one weights file (safetensors, or the torch pickle
the published checkpoints ship), named by a local path, `default` (the head for the target model)
or a Hugging Face hub id fetched on first use. What differs between methods (names, weight files,
defaults, the script that trains one here) is a `CheckpointKind`; the module and its keys stay with
the method (methods/medusa/heads.py, methods/eagle/head.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class CheckpointKind:
    what: str  # how messages name it: "Medusa heads", "EAGLE head"
    setting: str  # the method setting that names the directory: "method.heads"
    weight_files: tuple[str, ...]  # by preference; the last is the one the published checkpoints ship
    trainer: str  # the script that trains one here
    error: type[Exception]
    defaults: dict[str, str] = field(default_factory=dict)  # model name -> directory or hub id

    def read_config(self, directory: Path, required_key: str) -> dict:
        path = directory / CONFIG_FILE
        if not path.is_file():
            raise self.error(f"{self.what} directory '{directory}' has no {CONFIG_FILE}; pass {self.setting}=<dir> "
                             f"holding {CONFIG_FILE} and {' or '.join(self.weight_files)} (a published "
                             f"checkpoint, or one trained with {self.trainer})")
        try:
            cfg = json.loads(path.read_text())
        except ValueError as e:
            raise self.error(f"{path} is not valid JSON ({e}); is this a {self.what} directory?") from None
        if not isinstance(cfg, dict) or required_key not in cfg:
            raise self.error(f"{path}: no '{required_key}'; is this a {self.what} directory?")
        return cfg

    def weights_file(self, directory: Path) -> Path:
        for name in self.weight_files:
            if (directory / name).is_file():
                return directory / name
        raise self.error(f"{self.what} directory '{directory}' holds none of {', '.join(self.weight_files)}; "
                         f"pass {self.setting}=<dir> holding {CONFIG_FILE} and the weights")

    def read_weights(self, directory: Path) -> dict[str, torch.Tensor]:
        path = self.weights_file(directory)
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)

    def resolve(self, value: str | os.PathLike | None, model_name: str | None, download: bool = True) -> Path | None:
        """`default` (this model's), a local directory, or a hub id (fetched; None for one when not
        `download`, so settings are checked before anything is fetched)."""
        if value in (None, "default"):
            if model_name not in self.defaults:
                raise self.error(f"no default {self.what} for model '{model_name}' (defaults exist for "
                                 f"{', '.join(self.defaults)}); train one with {self.trainer} and pass "
                                 f"{self.setting}=<dir>")
            value = self.defaults[model_name]
        path = Path(os.path.expanduser(str(value)))
        if path.is_dir():
            return path
        if path.is_absolute() or str(value).startswith(".") or str(value).count("/") != 1:
            raise self.error(f"{self.what} directory '{value}' not found; pass {self.setting}=<dir> holding "
                             f"{CONFIG_FILE} and {' or '.join(self.weight_files[::-1])}, or a hub id owner/name")
        return self.download(str(value)) if download else None

    def download(self, repo_id: str) -> Path:
        try:
            from huggingface_hub import hf_hub_download

            config = hf_hub_download(repo_id, CONFIG_FILE)
            for name in self.weight_files[::-1]:
                try:
                    hf_hub_download(repo_id, name)
                    break
                except Exception:
                    if name == self.weight_files[0]:
                        raise
        except Exception as e:
            published = self.weight_files[-1]
            raise self.error(
                f"could not fetch the {self.what} '{repo_id}' from the Hugging Face hub ({type(e).__name__}). "
                f"Download its {CONFIG_FILE} and {published} on a machine with access (huggingface-cli download "
                f"{repo_id} {CONFIG_FILE} {published} --local-dir DIR) and pass {self.setting}=DIR") from None
        return Path(config).parent
