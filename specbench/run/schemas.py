"""The typed settings registered with Hydra: `run_schema` for config.yaml, the model and task schemas
for their groups, and every registered method's Settings as an option of the method group. Importing
this module registers them (the run's entry and run.py do)."""

from __future__ import annotations

import dataclasses
from dataclasses import field

from hydra.core.config_store import ConfigStore

from specbench.config import ModelConfig, RunConfig, TaskConfig
from specbench.registry import available_methods, drafter_class


def method_schema(name: str, settings: type) -> type:
    """`settings` with the method's name as a field: the config of `method=<name>`."""
    return dataclasses.make_dataclass(f"{settings.__name__}Config", [("name", str, field(default=name))],
                                      bases=(settings,))


def register_configs() -> None:
    """run_schema for config.yaml, model and task schemas for their groups, and every registered method
    as an option of the method group."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(name="model_schema", node=ModelConfig)  # not in the model group: no option of it
    cs.store(name="task_schema", node=TaskConfig)
    for name in available_methods():
        cs.store(group="method", name=name, node=method_schema(name, drafter_class(name).Settings))


register_configs()
