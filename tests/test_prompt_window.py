"""No prompt runs past the model's window: a run (single or serving) refuses one in one `error:` line,
exit 2, before anything is timed, naming the question, its prompt tokens, max_new_tokens, the
window and the fix; the engines refuse one as a backstop."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

import run as cli
from specbench.decoding.batched import BatchedEngine, Request
from specbench.decoding.step import check_context
from specbench.errors import InputError
from specbench.methods.ar import Autoregressive
from specbench.run import serving, session, single
from specbench.inputs.window import check_prompts_fit
from tests.conftest import save_tiny_llama_dir
from tests.test_config import CONF


def test_the_first_prompt_past_the_window_is_named_with_the_fix():
    prompts = [("long-1k", "1k", 1000), ("long-8k-a", "8k", 7500), ("long-8k-b", "8k", 7600)]
    check_prompts_fit(prompts, 592, 8192, "smollm2-135m")  # 7600 + 592 = 8192: fits exactly
    with pytest.raises(InputError) as e:
        check_prompts_fit(prompts, 1000, 8192, "smollm2-135m")
    assert str(e.value) == ("question 'long-8k-a' (subtask 8k): its prompt of 7500 tokens and max_new_tokens=1000 need "
                            "8500 positions, beyond the context of model smollm2-135m (8192 positions), as does 1 more "
                            "question; set max_new_tokens to at most 592 or keep the subtasks that fit "
                            "(task.subtasks=[1k])")
    with pytest.raises(InputError, match=r"its prompt of 9000 tokens .*; use shorter prompts$"):
        check_prompts_fit([("q", "8k", 9000)], 16, 8192, "m")
    check_prompts_fit([("q", "8k", 9000)], 16, None, "m")  # the window unknown: nothing to check


def test_the_engines_refuse_a_prompt_past_the_window(tiny_llama):
    check_context(256, 40, tiny_llama, 216)  # 256 positions: fits
    with pytest.raises(InputError, match=r"a prompt of 217 tokens and max_new_tokens=40 need 257 positions, beyond the "
                                         r"context of model .* \(256 positions\); set max_new_tokens to at most 39"):
        check_context(256, 40, tiny_llama, 217)
    with pytest.raises(InputError, match=r"max_new_tokens=256 is beyond the context"):  # no prompt length: as before
        check_context(256, 256)
    with pytest.raises(InputError, match="shorten the prompt$"):
        check_context(256, 4, None, 300)
    with pytest.raises(InputError, match="context"):
        BatchedEngine(tiny_llama, []).generate([Request(list(range(1, 97)) * 3, 40, Autoregressive)], max_batch=2)


@pytest.fixture(scope="module")
def short_window_model(tmp_path_factory, real_model):
    """A two-layer random Llama of 256 positions with the embedded model's tokenizer, as a model
    directory: the mini task's prompts (116 tokens and more with the chat template) fit it, but not
    with 200 new tokens, which alone do (so the settings' own check lets them through)."""
    return save_tiny_llama_dir(tmp_path_factory.mktemp("short_window"), real_model[1], max_positions=256)


def _never(what):
    def fail(*args, **kwargs):
        raise AssertionError(f"{what} was reached: the prompt past the window was not refused before timing")
    return fail


WINDOW = "beyond the context of model hf (256 positions)"
# a run's questions by their first turns (a later turn's prompt, known as it starts, meets the engine's check)
REFUSAL = (f"error: question 'mini-mt-2' (subtask mt): its prompt of 58 tokens and max_new_tokens=200 need 258 "
           f"positions, {WINDOW}, as do 8 more questions; set max_new_tokens to at most 154 or keep the "
           "subtasks that fit (task.subtasks=[qa])")


@pytest.mark.parametrize("kind,load", [("single", []), ("serving", ["batch_size=2"])], ids=["single", "serving"])
def test_a_run_refuses_a_prompt_past_the_window_in_one_line(kind, load, short_window_model, tmp_path, monkeypatch,
                                                             capsys):
    monkeypatch.setattr(session.Session, "_rounding_band", _never("the rounding band"))
    for name in ("warm_up", "answer_questions"):
        monkeypatch.setattr(single, name, _never(name))
    monkeypatch.setattr(serving.BatchedEngine, "generate", _never("the batched engine"))
    overrides = ["model=hf", f"model.path={short_window_model}", "task=mini", "max_new_tokens=200", "warmup=0",
                 "cost_curve=off", "progress=false", "wandb.enabled=false", f"results_root={tmp_path}", *load]
    with initialize_config_dir(config_dir=CONF, version_base=None):
        code = cli.run_config(compose("config", overrides=overrides))
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("Loading weights")]  # transformers' bar
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == REFUSAL
