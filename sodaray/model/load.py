"""Loading a frozen causal LM from a hub id, a local folder or a GGUF file, with one-line errors
that name the file at fault, and the revision that says which weights a loaded model is."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from pathlib import Path

import torch

from sodaray.errors import first_line
from sodaray.io.modelfiles import (
    ModelLoadError,
    check_gguf_file,
    check_tokenizer_files,
    check_weight_files,
    damaged_tokenizer_file,
    weight_file_errors,
)
from sodaray.model.loaded import LoadedModel, wrap_model

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(
    name_or_path: str, gguf_file: str | None = None, *, error: type[Exception] = ModelLoadError
) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file name): a path ending in `.gguf` is split into the two, and a
    local path that does not exist is an `error` (checked before any slow work)."""
    if name_or_path.endswith(".gguf") and gguf_file is not None:
        raise error(
            f"{name_or_path} is a GGUF file and a GGUF file name ({gguf_file}) is given too: "
            "give the .gguf path alone, or its folder and the file name"
        )
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path)
        name_or_path, gguf_file = str(path.parent), path.name
    local = os.path.expanduser(name_or_path)
    if name_or_path.startswith(("/", "./", "../", "~")) and not os.path.exists(local):
        raise error(f"no such model folder or file: {name_or_path}")
    if gguf_file is None and os.path.isfile(local):
        raise error(
            f"{name_or_path} is a file, not a model folder (give the folder that holds "
            "config.json and the weights, or a .gguf file)"
        )
    if gguf_file is not None and os.path.isdir(local):
        if not os.path.isfile(os.path.join(local, gguf_file)):
            raise error(f"GGUF file {gguf_file!r} not found in {name_or_path}")
        check_gguf_file(Path(name_or_path) / gguf_file, error)  # a cut download, said so
    return name_or_path, gguf_file


def load_model(
    name_or_path: str,
    *,
    gguf_file: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "float32",
    bos: bool | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a causal LM by hub id, local folder, or GGUF file (`gguf_file` inside the folder,
    or a path ending in `.gguf`), frozen, on `device`. `bos` prepends the tokenizer's BOS token
    as fixed context before the searched input (default: as the tokenizer does for text)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name_or_path, gguf_file = resolve_model_path(name_or_path, gguf_file)
    if not isinstance(dtype, torch.dtype) and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else DTYPES[dtype]
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    else:
        check_weight_files(name_or_path)  # a cut or damaged file named, not only its folder
        check_tokenizer_files(name_or_path)  # a FIFO would block the tokenizer's read
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, **kwargs)
    except RuntimeError as exc:
        # What transformers raises for weights whose shapes are not the config's (another
        # model's checkpoint beside this config): about the files, so said about them.
        if "mismatched_sizes" not in str(exc) and "size mismatch" not in str(exc):
            raise
        raise ModelLoadError(
            f"cannot load model {_weights_label(name_or_path, gguf_file)}: its tensors' shapes "
            "are not the ones its config.json describes (weights of another model?)"
        ) from exc
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refused the file
        raise ModelLoadError(
            f"cannot load model {name_or_path!r}: its weights are a pickle that holds more than "
            "tensors, which could run code when loaded; refused (convert it to safetensors)"
        ) from exc
    except (OSError, ValueError, KeyError, *weight_file_errors()) as exc:
        raise ModelLoadError(
            f"cannot load model {_load_label(name_or_path, gguf_file, exc)}"
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        damaged = damaged_tokenizer_file(name_or_path)
        if damaged is not None:  # a tokenizer is there but broken: said, not dropped
            raise ModelLoadError(f"cannot load the tokenizer: {damaged}") from exc
        log.warning("no tokenizer for %s (%s); token ids only", name_or_path, exc)
        tokenizer = None
    model.to(device)
    label = f"{name_or_path}/{gguf_file}" if gguf_file else name_or_path
    return wrap_model(model, tokenizer, name=label, bos=bos)


def _weights_label(name_or_path: str, gguf_file: str | None) -> str:
    """The weight files a load read, for its error: the GGUF file, a local folder's weight
    files (named when few), else the model as given."""
    local = Path(name_or_path).expanduser()
    if gguf_file is not None:
        return str(local / gguf_file)
    if local.is_dir():
        files = sorted(f.name for f in local.iterdir() if f.suffix in (".safetensors", ".bin"))
        if 0 < len(files) <= 3:
            return ", ".join(str(local / f) for f in files)
    return repr(name_or_path)


def _load_label(name_or_path: str, gguf_file: str | None, exc: BaseException) -> str:
    """What a failed load names, then why: the GGUF file, a local folder's config.json when
    the config is what was refused (an architecture this transformers does not know), else
    the model as given."""
    why = first_line(exc)
    local = Path(name_or_path).expanduser()
    if gguf_file is not None:
        return f"{local / gguf_file}: {why}"
    if local.is_dir() and "model type" in why and "config.json" not in why:
        return f"{local / 'config.json'}: {why}"
    return f"{name_or_path!r}: {why}"


# (path, size, mtime) of each file -> its content hash: an actor hashes its model once, not
# once per shard.
_FILE_HASHES: dict[tuple[tuple[str, int, int], ...], str] = {}


def model_revision(model: LoadedModel) -> str | None:
    """Which weights `model` is: the hub commit it was loaded from, else `sha256:` and 16 hex
    digits of its local files' contents (a GGUF file, or every file directly in its folder:
    weights, config and tokenizer), else None (a model built in memory). A path alone says
    nothing: the same folder may hold another checkpoint tomorrow."""
    commit = getattr(getattr(model.model, "config", None), "_commit_hash", None)
    if commit:
        return str(commit)
    path = Path(model.name).expanduser()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith("."))
    else:
        return None
    key = tuple((str(f), (st := f.stat()).st_size, st.st_mtime_ns) for f in files)
    if key not in _FILE_HASHES:
        digest = hashlib.sha256()
        for (_, size, _), f in zip(key, files, strict=True):
            digest.update(f"{f.name}\0{size}\0".encode())  # unambiguous file boundaries
            with f.open("rb") as stream:
                while chunk := stream.read(1 << 22):
                    digest.update(chunk)
        _FILE_HASHES[key] = "sha256:" + digest.hexdigest()[:16]
    return _FILE_HASHES[key]
