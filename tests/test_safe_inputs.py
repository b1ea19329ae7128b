"""Inputs that must be read safely: one huge line of real text, names that try to leave their folder, and no
loader in the package that can run code (pickle, eval). The malformed-input suite is
``tests/test_malformed_inputs.py``."""

from __future__ import annotations

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
