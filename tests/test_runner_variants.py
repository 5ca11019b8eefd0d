"""Method settings name their own results directories; a lossy option is run, checked and reported
apart from the lossless tally."""

import json

import pytest

from specbench.errors import SettingsError
from specbench.run.plan import check_identity, method_variant, results_dir_for
from specbench.main import main_exit_code
from specbench.run.plan import run_settings
from tests.test_config import cfg


def _cfg(*overrides):
    c = cfg(*overrides)
    c["max_new_tokens"] = c["max_new_tokens"] or 32
    return run_settings(c)


def test_default_settings_have_no_variant_label():
    c = _cfg("method=tr", "max_new_tokens=32")
    assert method_variant(c) == ""
    assert str(results_dir_for(c, "tr")) == "results/smollm2-135m/mini/tr-t0-m32"


def test_changed_settings_get_their_own_directory():
    c = _cfg("method=tr", "method.k=4", "method.cold_start=true", "max_new_tokens=32")
    assert str(results_dir_for(c, "tr")) == "results/smollm2-135m/mini/tr-t0-m32~cold_start=True,k=4"
    # the AR reference of a variant is the plain AR directory
    assert str(results_dir_for(c, "ar")) == "results/smollm2-135m/mini/ar-t0-m32"
    inline = _cfg("method=tr", "method.tree=[[2],[1,1]]", "max_new_tokens=32")
    label = method_variant(inline)
    assert label.startswith("~") and len(label) == 9  # an inline tree becomes a short hash


def test_task_selection_is_part_of_the_directory():
    c = _cfg("task=spec_bench", "task.path=q.jsonl", "task.subtasks=[qa,rag]", "task.per_subtask=2",
             "max_new_tokens=32")
    assert str(results_dir_for(c, "pld")) == "results/smollm2-135m/spec_bench-qa+rag-ps2/pld-t0-m32"


def test_a_dtype_sweep_writes_each_dtype_to_its_own_directory():
    """`-m dtype=bfloat16,float16` (the half-precision sweep): neither run finds the other's answers."""
    names = {d: str(results_dir_for(_cfg("method=pld", f"dtype={d}", "max_new_tokens=32"), "pld"))
             for d in ("float32", "auto", "bfloat16", "float16")}
    assert names["float32"] == names["auto"] == "results/smollm2-135m/mini/pld-t0-m32"
    assert names["bfloat16"].endswith("pld-t0-m32-bf16") and names["float16"].endswith("pld-t0-m32-fp16")


def test_answers_of_other_method_settings_are_not_resumed(tmp_path):
    (tmp_path / "run_config.json").write_text(json.dumps(
        {"identity": {"model": "m", "method": "tr", "method_params": {"k": 8}}}))
    check_identity(tmp_path, {"model": "m", "method": "tr", "method_params": {"k": 8}})
    with pytest.raises(SettingsError, match="other settings"):
        check_identity(tmp_path, {"model": "m", "method": "tr", "method_params": {"k": 4}})


def test_typical_medusa_is_marked_lossy_and_never_fails_the_run(real_model, tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import run_benchmark
    from tests.test_config import CONF

    with initialize_config_dir(config_dir=CONF, version_base=None):
        c = OmegaConf.to_container(compose("config", overrides=[
            "method=medusa", "method.typical=true", "task.limit=1", "max_new_tokens=16", "warmup=0",
            f"results_root={tmp_path}", "progress=false", "cost_curve=off"]), resolve=True)
    summary = run_benchmark(c)
    assert summary["lossless_method"] is False
    assert summary["results_dir"].endswith("medusa-t0-m16~typical=True")
    lo = summary["lossless"]
    assert lo["mismatches"] == 0 and lo["exact"] + lo["lossy_differences"] == lo["checked"] == 1
    assert main_exit_code(summary, c) == 0


def test_a_run_without_max_new_tokens_warms_up_and_decodes_on_the_tasks_budget(real_model, tmp_path):
    """`max_new_tokens` unset (the README's command 1): the warm-up and every turn use the task's budget."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import run_benchmark
    from tests.test_config import CONF

    with initialize_config_dir(config_dir=CONF, version_base=None):
        c = OmegaConf.to_container(compose("config", overrides=[
            "method=pld", "task.limit=1", "task.max_new_tokens=8", "warmup=1", f"results_root={tmp_path}",
            "progress=false", "cost_curve=off"]), resolve=True)
    assert c["max_new_tokens"] is None
    summary = run_benchmark(c)
    assert summary["max_new_tokens"] == 8 and summary["results_dir"].endswith("pld-t0-m8")
    assert summary["lossless"]["mismatches"] == 0 and main_exit_code(summary, c) == 0


def test_table_footer_says_what_to_try_when_tr_is_slow():
    from specbench.report.console import format_table

    summary = {"method": "tr", "speedup": {"qa": 0.5, "overall": 0.5}, "decode_speedup": {"overall": 0.5},
               "speedup_bound": 0.49, "mat": 2.3, "tokens_per_s": 7.5, "baseline_tokens_per_s": 15.0,
               "lossless": {"exact": 2, "checked": 2, "numeric_ties": 0, "mismatches": 0},
               "speedup_bound_detail": {"cost_curve": {"quick": False, "device": "cpu", "dtype": "float32",
                                                       "t1_ms": 70.0}, "mean_rows": 81.0}}
    assert "method=tr_adaptive" in format_table(summary).splitlines()[-1]
    summary["speedup"]["overall"] = 1.2
    assert "tr_adaptive" not in format_table(summary)


def test_prefix_cache_keeps_a_conversation_between_its_turns(real_model, tmp_path):
    """prefix_cache=true: turn 2 of a two-turn question prefills only what turn 1 did not leave in the
    cache, for AR and the method alike, and answers what a run prefilling every turn whole answers."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import run_benchmark
    from tests.test_config import CONF

    def run(*extra):
        with initialize_config_dir(config_dir=CONF, version_base=None):
            c = OmegaConf.to_container(compose("config", overrides=[
                "method=pld", "task.subtasks=[mt]", "task.limit=1", "max_new_tokens=16", "warmup=0",
                f"results_root={tmp_path}", "progress=false", "cost_curve=off", *extra]), resolve=True)
        summary = run_benchmark(c)
        assert summary["lossless"]["mismatches"] == 0 and main_exit_code(summary, c) == 0
        folder = summary["results_dir"]
        return folder, [[json.loads(line) for line in open(f"{folder}/{name}.jsonl")]
                        for name in ("answers", "baseline_answers")]

    folder, kept = run("prefix_cache=true")
    whole_folder, whole = run()
    assert folder.endswith("pld-t0-m16-pc") and whole_folder.endswith("pld-t0-m16")
    for answers in kept:
        (one, two), = [r["turns"] for r in answers]
        assert one["prefix_reused"] == 0 and two["prefix_reused"] > one["input_tokens"]
    for answers, plain in zip(kept, whole):
        assert [t["token_ids"] for t in answers[0]["turns"]] == [t["token_ids"] for t in plain[0]["turns"]]
        assert "prefix_reused" not in plain[0]["turns"][1]
    from specbench.report.collect import load_runs, run_meta

    assert sorted(run_meta(r)["task"] for r in load_runs(tmp_path) if r.method == "pld") == ["mini", "mini-pc"]


def test_prefix_cache_is_refused_where_it_cannot_apply():
    from specbench.run.plan import plan_run

    with pytest.raises(SettingsError, match="hidden states of every prompt row"):
        plan_run(_cfg("method=eagle", "prefix_cache=true"))
    with pytest.raises(SettingsError, match="prefill_update=true"):
        plan_run(_cfg("method=tr", "method.prefill_update=true", "prefix_cache=true"))
    with pytest.raises(SettingsError, match="prefix_cache"):
        plan_run(_cfg("method=pld", "batch_size=2", "prefix_cache=true"))
