"""Which files a Hub id's snapshot fetches: the shards its index names, not every copy."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.utils import filter_repo_objects

from bulkgen.model import hub

SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
# mistralai/Mistral-7B-Instruct-v0.3, the mistral-7b alias: Mistral's own consolidated copy of
# the weights beside the Hugging Face shards.
MISTRAL = ["config.json", "consolidated.safetensors", "generation_config.json", *SHARDS,
           "model.safetensors.index.json", "params.json", "tokenizer.json", "tokenizer.model",
           "tokenizer.model.v3", "tokenizer_config.json", "README.md"]  # fmt: skip


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """snapshot_download over a repository listing, filtered as huggingface_hub filters it."""
    fetched: set[str] = set()

    def serve(files: list[str]):
        def snapshot_download(repo_id, allow_patterns=None, cache_dir=None, **_):
            folder = tmp_path / "snapshot"
            folder.mkdir(exist_ok=True)
            for name in filter_repo_objects(files, allow_patterns=allow_patterns):
                fetched.add(name)
                shards = {f"w{i}": s for i, s in enumerate(SHARDS)}
                index = name == "model.safetensors.index.json"
                (folder / name).write_text(json.dumps({"weight_map": shards} if index else {}))
            return str(folder)

        monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
        return fetched

    return serve


def test_a_repository_with_an_index_fetches_the_shards_it_names_only(fake_hub, tmp_path):
    fetched = fake_hub(MISTRAL)
    folder = hub.resolve_model("mistral-7b", cache_dir=str(tmp_path))
    assert sorted(n for n in fetched if n.endswith(".safetensors")) == SHARDS
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= fetched
    assert Path(folder).name == "snapshot"


def test_a_repository_without_an_index_fetches_its_safetensors(fake_hub, tmp_path):
    fetched = fake_hub(["config.json", "model.safetensors", "tokenizer.json"])
    hub.resolve_model("org/tiny", cache_dir=str(tmp_path))
    assert fetched == {"config.json", "model.safetensors", "tokenizer.json"}
