"""One record per kind of run (issue 55 item 2): ``RunConfig.kind`` names a :class:`~plelab.training.task.Kind`, whose
package is imported only when a config asks for it; configs that said ``visual.enabled`` still load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plelab.config import RunConfig, resolve_config
from plelab.errors import ConfigError
from plelab.training.task import task_kind


def test_the_config_api_loads_no_kind_of_run_it_does_not_ask_for():
    code = ("import sys, plelab; plelab.RunConfig; plelab.resolve_config('cpu-tiny'); "
            "print(sorted(m for m in sys.modules if m.startswith('plelab.visual')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_kind_is_one_record_and_its_package_loads_on_first_use():
    code = ("import sys; from plelab.config import resolve_config; from plelab.training.task import task_kind; "
            "k = task_kind(resolve_config('cpu-tiny', ['kind=visual'], dp=8)); "
            "print(k.name, k.text_model, k.exportable, k.trains_bpe, 'plelab.visual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["visual", "False", "False", "False", "True"]
    text = task_kind(resolve_config("cpu-tiny"))
    assert (text.name, text.text_model, text.exportable, text.trains_bpe) == ("text", True, True, True)


def test_old_configs_that_said_visual_enabled_still_load():
    assert resolve_config("cpu-tiny", ["visual.enabled=true"], dp=8).kind == "visual"
    assert resolve_config("cpu-tiny", ["visual.enabled=true", "visual.enabled=false"]).kind == "text"
    assert RunConfig.from_dict({"visual": {"enabled": True, "ids": "oracle"}}).kind == "visual"
    assert RunConfig.from_dict({"visual": {"enabled": False}}).kind == "text"
    saved = RunConfig.from_dict(json.loads(json.dumps({"preset": "cpu-tiny", "visual": {"enabled": True}})))
    assert "enabled" not in saved.to_dict()["visual"] and saved.to_dict()["kind"] == "visual"


def test_an_unknown_kind_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"invalid config value kind='audio': allowed text \| visual"):
        resolve_config("cpu-tiny", ["kind=audio"])


def test_the_trainer_and_its_task_hold_one_config(tmp_path):
    from plelab.runs import make_trainer, prepare_data

    cfg = resolve_config("cpu-tiny", ["train.precision=auto"], steps=2)
    trainer = make_trainer(cfg, prepare_data(cfg, progress=False), tmp_path / "run", progress=False,
                           log=lambda *a: None)
    try:
        assert trainer.cfg is trainer.task.cfg and trainer.cfg.train.precision in ("fp32", "bf16")
        assert all(getattr(o, "cfg", trainer.cfg) is trainer.cfg for o in trainer.observers)
    finally:
        trainer.release()
