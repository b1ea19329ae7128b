"""Every transformers ``from_pretrained`` in plelab goes through :func:`from_pretrained`: local safetensors only,
errors on one line.

Why one wrapper: transformers' ``from_pretrained`` falls back to ``pytorch_model.bin`` — a pickle, from which
``torch.load`` can run code — when a folder has no ``model.safetensors``, fetches from the Hub when a path does not
exist, and runs a folder's own Python with ``trust_remote_code``. plelab never unpickles and never downloads, so
the wrapper

- refuses a folder without ``.safetensors`` weights before transformers sees it, naming the pickle it found
  (:func:`check_safetensors_folder`, also what ``plelab visual-ids --siglip`` checks before any work);
- forces ``use_safetensors=True``, ``local_files_only=True`` and ``trust_remote_code=False`` (a caller asking for
  anything else is refused, not overridden in silence);
- maps the loaders' errors (a cut or corrupt ``model.safetensors``, an unreadable ``config.json``, weights that do
  not fit the config) to one :class:`~plelab.errors.PlelabError` line naming the folder, the cause and the fix;
- refuses weights transformers would leave at their random init (missing from the files: it only logs that) and
  tensors whose stored dtype is of another kind than the model's (a float weight relabelled ``I32`` in the header:
  :func:`~plelab.model.loading.check_tensors`).

``tests/test_safe_inputs.py`` fails on any other ``from_pretrained(`` call in the package.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError

from plelab.errors import PlelabError
from plelab.integrations.hf_model import quiet_transformers
from plelab.model.loading import check_tensors, header_specs

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # weights formats that torch.load unpickles
WEIGHTS, INDEX = "model*.safetensors", "*.safetensors.index.json"  # what save_pretrained writes (whole / sharded)
FORCED = {"use_safetensors": True, "local_files_only": True, "trust_remote_code": False}
# What transformers and safetensors raise for a folder they cannot load (a bug in plelab raises something else).
LOADER_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError, IndexError, SafetensorError)


def loader_errors() -> tuple[type[BaseException], ...]:
    """:data:`LOADER_ERRORS` and huggingface_hub's ``StrictDataclassError``: transformers 5 checks a config's field
    types with it (``"hidden_size": 2.0`` or ``"num_hidden_layers": [2]`` in a config.json), and it derives from
    ``Exception`` alone. For every ``except`` around a transformers config or model load."""
    try:
        from huggingface_hub.errors import StrictDataclassError  # with transformers (the hf extra)
    except ImportError:  # an older huggingface_hub: transformers raises ValueError / TypeError there
        return LOADER_ERRORS
    return (*LOADER_ERRORS, StrictDataclassError)


def loader_reason(err: BaseException, limit: int = 300) -> str:
    """``err`` as one line of at most ``limit`` characters (a strict-dataclass error says the field on its first
    line and the type on the next; an unknown model_type lists every type transformers knows)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"
SAVE_AGAIN = "save the model with save_pretrained(folder, safe_serialization=True) and pass that folder"


def check_safetensors_folder(path: str | Path, what: str = "a model") -> Path:
    """``path`` as a ``Path`` if it is a local folder holding the safetensors weights save_pretrained writes
    (``model.safetensors``, or shards and their index) of ``what``; else one line saying which (pickle-based)
    weights it holds instead and how to convert them."""
    path = Path(path)
    if not path.is_dir():
        raise PlelabError(f"{path} does not exist or is not a folder; give a local folder holding {what}, written by "
                          "save_pretrained (nothing is downloaded)")
    if not any(path.glob(WEIGHTS)) and not any(path.glob(INDEX)):
        pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        found = f" (found {pickled[0]}, a pickle-based format plelab never loads)" if pickled else ""
        raise PlelabError(f"{path} holds no model.safetensors weights{found}, so it cannot be loaded as {what}; "
                          f"{SAVE_AGAIN}")
    return path


def from_pretrained(cls: str | type, path: str | Path, what: str = "a model", **kwargs):
    """``cls.from_pretrained(path, **kwargs)`` from a local folder's safetensors weights only, transformers' logging
    quiet (``cls``: a transformers class, or its name such as ``"AutoModelForCausalLM"``); loader errors as one line
    that says ``path`` cannot be loaded as ``what``, why, and how to fix it."""
    for key, value in FORCED.items():
        # local_files_only=False only permits a download, and the path is checked to be a local folder below (the
        # Auto classes of transformers >= 5.25 pass it to a registered class's from_pretrained by default)
        if key in kwargs and kwargs[key] != value and not (key == "local_files_only" and kwargs[key] is False):
            raise PlelabError(f"from_pretrained({key}={kwargs[key]!r}) is refused: plelab loads only local "
                              "safetensors weights, never pickles, downloads or a folder's own code")
        kwargs[key] = value
    path = check_safetensors_folder(path, what)
    with quiet_transformers() as transformers:
        cls = getattr(transformers, cls) if isinstance(cls, str) else cls
        try:
            model, info = cls.from_pretrained(str(path), output_loading_info=True, **kwargs)
        except loader_errors() as err:
            why = loader_reason(err)
            raise PlelabError(f"transformers cannot load {path} as {what} ({type(err).__name__}: {why}); check that "
                              f"its config.json and .safetensors files are complete, or {SAVE_AGAIN}") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would leave them at random values, saying so only in a log line
        raise PlelabError(f"{path} lacks {len(missing)} of the tensors of {what} (e.g. {missing[0]}); its weights "
                          f"are incomplete or for another model — {SAVE_AGAIN}")
    stored = {name: spec for file in sorted(path.glob(WEIGHTS)) for name, spec in header_specs(file).items()}
    check_tensors(str(path), stored, model.state_dict(), f"{SAVE_AGAIN}", exact_dtype=False, complete=False,
                  extra=True)
    return model
