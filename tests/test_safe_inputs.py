"""Inputs that must be read safely: one huge line of real text, names that try to leave their folder, and no
loader in the package that can run code (pickle, eval). The malformed-input suite is
``tests/test_malformed_inputs.py``."""

from __future__ import annotations

import ast
import json
import os
import pickle
import random
import re
from pathlib import Path

import pytest

from plelab.errors import PlelabError
from plelab.io import check_name


def test_one_huge_line_of_text_becomes_many_documents(tmp_path):
    from plelab.data.sources import user_corpus

    rng = random.Random(0)
    path = tmp_path / "one-line.txt"
    path.write_text(" ".join(f"w{rng.randrange(5000)}" for _ in range(300_000)))  # ~1.8 MB, no line break
    docs = user_corpus(path).documents
    assert len(docs) > 100 and max(map(len, docs)) < 10_000
    assert " ".join(d.strip() for d in docs).split() == path.read_text().split()  # nothing lost or split mid-word


# ---- safe loading ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../x", "..", "/abs/path", "a/b", "a\\b", ".hidden", "", "a\x00b", "a\nb", 3])
def test_names_cannot_leave_their_folder(name):
    from plelab.sweeps.spec import run_dir

    with pytest.raises(PlelabError, match="invalid arm name") as exc:
        run_dir(Path("sweep"), name, 0)
    assert "\n" not in str(exc.value)
    assert check_name("dp8-scalar_2", "arm name") == "dp8-scalar_2"


def test_source_loads_weights_only_from_safetensors_and_configs_only_as_json():
    """No pickle, no evaluation: any torch.load passes weights_only=True, numpy never unpickles, and no
    config, state or sweep file is read with eval / exec / yaml / pickle."""
    package = Path(__file__).resolve().parents[1] / "plelab"
    forbidden = [(r"\bimport pickle\b|\bpickle\.load|\bcloudpickle\b|\bdill\b", "pickle"),
                 (r"(?<![\w.])(eval|exec)\(", "eval/exec"), (r"\byaml\.(unsafe_)?load\(", "yaml.load"),
                 (r"allow_pickle\s*=\s*True", "allow_pickle=True"), (r"\bmarshal\.loads?\(", "marshal")]
    problems = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        for call in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", text):
            if "weights_only=True" not in call.group(0):
                problems.append(f"{path.name}: {call.group(0)[:60]}")
        problems += [f"{path.name}: {what}" for pattern, what in forbidden if re.search(pattern, text)]
        if re.search(r"\bnp\.load\(", text):
            problems += [f"{path.name}: np.load without allow_pickle=False" for call in re.findall(
                r"np\.load\([^)]*\)", text) if "allow_pickle=False" not in call]
    assert not problems, problems


def test_every_from_pretrained_goes_through_the_safetensors_wrapper():
    """transformers' from_pretrained falls back to pytorch_model.bin (a pickle) without use_safetensors=True: the only
    call in the package is plelab.integrations.pretrained's, which forces it (read from the syntax tree, so a
    docstring that names the method does not count, and a getattr with its name does)."""
    package = Path(__file__).resolve().parents[1] / "plelab"
    wrapper = package / "integrations" / "pretrained.py"
    calls = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            named = (isinstance(node, ast.Attribute) and node.attr == "from_pretrained"
                     or isinstance(node, ast.Constant) and node.value == "from_pretrained")
            if named:
                calls.append(f"{path.relative_to(package)}:{node.lineno}")
    assert calls and all(c.startswith("integrations/pretrained.py:") for c in calls), calls
    text = wrapper.read_text()
    assert '"use_safetensors": True' in text and '"trust_remote_code": False' in text


def _pickle_only_folder(tmp_path: Path, marker: Path) -> Path:
    """A tiny random HF model (PLE attached) saved with pytorch_model.bin instead of model.safetensors, as older
    transformers wrote it; the file is a pickle that would create ``marker`` if it were ever unpickled."""
    from hf_models import tiny_host

    import plelab

    folder = tmp_path / "pickled"
    plelab.attach(tiny_host(), dim=8).save_pretrained(folder, safe_serialization=False)  # transformers 5: safetensors
    for f in folder.glob("model*.safetensors"):
        f.unlink()
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump(_Payload(marker), f)
    return folder


class _Payload:
    """Unpickling this runs a shell command that creates ``marker`` (it must never happen)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_only_hf_folder_is_refused_in_one_line_never_loaded(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import torch

    import plelab
    from plelab.integrations.pretrained import from_pretrained

    marker = tmp_path / "PWNED"
    folder = _pickle_only_folder(tmp_path, marker)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    for load in (lambda: from_pretrained("AutoModelForCausalLM", folder, "a causal LM"),
                 lambda: plelab.load_attached(folder)):
        with pytest.raises(PlelabError) as exc:
            load()
        assert "\n" not in str(exc.value), exc.value
        assert f"{folder} holds no model.safetensors weights (found pytorch_model.bin, a pickle-based" in str(exc.value)
    assert not marker.exists()


def test_from_pretrained_refuses_cut_incomplete_and_relabelled_weights_in_one_line(tmp_path):
    pytest.importorskip("transformers")
    from hf_models import tiny_host
    from safetensors_edit import relabel

    from plelab.integrations.pretrained import from_pretrained

    folder = tmp_path / "host"
    tiny_host().save_pretrained(folder)
    whole = (folder / "model.safetensors").read_bytes()
    assert from_pretrained("AutoModelForCausalLM", folder, "a causal LM") is not None
    cases = [(lambda f: f.write_bytes(whole[: len(whole) * 6 // 10]), {}, "transformers cannot load"),
             (lambda f: f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "), {},
              "lacks 21 of the tensors of a causal LM"),
             (lambda f: relabel(f, "model.embed_tokens.weight"), {},
              "model.embed_tokens.weight is stored as int32, the model expects float32"),
             (lambda f: None, {"use_safetensors": False}, "is refused"),
             (lambda f: None, {"trust_remote_code": True}, "is refused")]
    for damage, kwargs, needle in cases:
        (folder / "model.safetensors").write_bytes(whole)
        damage(folder / "model.safetensors")
        with pytest.raises(PlelabError, match=needle) as exc:
            from_pretrained("AutoModelForCausalLM", folder, "a causal LM", **kwargs)
        assert "\n" not in str(exc.value), exc.value


def test_a_config_field_of_another_type_is_one_line_from_every_transformers_load(tmp_path):
    """Issue 54 (low items: load_attached's raw exceptions, a foreign config.json with num_hidden_layers 2.0 or a
    list): transformers 5 checks a config's field types with huggingface_hub's StrictDataclassError, which derives
    from Exception alone — a traceback from load_attached, diagnose's use test and an HF trunk's build before."""
    pytest.importorskip("transformers")
    from hf_models import tiny_host

    import plelab
    from plelab.config import resolve_config
    from plelab.integrations.hosts import build_hf

    attached = tmp_path / "attached"
    plelab.attach(tiny_host(), dim=8).save_pretrained(attached)
    config = json.loads((attached / "config.json").read_text())
    host_typed = tmp_path / "host-typed"  # the older folders: the host's model_type, the PLE entry beside it
    host_typed.mkdir()
    (host_typed / "model.safetensors").write_bytes((attached / "model.safetensors").read_bytes())
    for key, value, needle in (("hidden_size", 2.0, "Field 'hidden_size' expected int, got float (value: 2.0)"),
                               ("num_hidden_layers", [2], "Field 'num_hidden_layers' expected int, got list")):
        (attached / "config.json").write_text(json.dumps({**config, key: value}))
        (host_typed / "config.json").write_text(json.dumps({**config, "model_type": "llama", key: value}))
        for folder in (attached, host_typed):
            with pytest.raises(PlelabError, match=re.escape(needle)) as exc:
                plelab.load_attached(folder)
            assert "\n" not in str(exc.value) and str(folder) in str(exc.value)
    (attached / "config.json").write_text(json.dumps({**config, "plelab_ple": {**config["plelab_ple"],
                                                                              "host_model_type": "banana"}}))
    with pytest.raises(PlelabError, match="cannot rebuild its host config of type 'banana'") as exc:
        plelab.load_attached(attached)
    assert len(str(exc.value)) < 600  # not the 11,000-character list of every model type transformers knows
    trunk = tmp_path / "trunk.json"
    trunk.write_text(json.dumps({"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "attention_bias": "yes"}))
    with pytest.raises(PlelabError, match="Field 'attention_bias' expected bool, got str") as exc:
        build_hf(resolve_config("cpu-tiny", [f"model.hf_config={trunk}"]))
    assert "\n" not in str(exc.value)
