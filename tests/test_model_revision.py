"""A job on a Hub id is not resumed on another revision of the model (the cache's refs/main
moved since it started): its rows would be of two models."""

from __future__ import annotations

import json
import os
import shutil

import huggingface_hub.constants
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.io.model_revision import same_files, snapshot


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 2}))


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_snapshot_path_names_its_repository_and_revision():
    path = "/c/hub/models--org--tiny/snapshots/abc123"
    assert snapshot(path) == ("models--org--tiny", "abc123")
    assert snapshot("/models/tiny") is None and snapshot(None) is None


def test_a_rerun_on_another_revision_is_refused(tmp_path, tiny_model_dir, monkeypatch):
    repo = tmp_path / "hub" / "models--org--tiny"
    for revision in ("1111111", "2222222"):
        shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1111111")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "a.jsonl").write_text(json.dumps({"prompt": "question"}) + "\n")
    args = [data, "-m", "org/tiny", "-o", out, "-q"]
    assert bulkgen("run", *args).exit_code == 0
    (repo / "refs" / "main").write_text("2222222")  # the repository was updated
    (data / "b.jsonl").write_text(json.dumps({"prompt": "question"}) + "\n")  # new rows
    result = bulkgen("run", *args)
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "\n" not in line and "revision 1111111" in line and "revision 2222222" in line
    assert not (out / "part-00001.parquet").exists()
    (repo / "refs" / "main").write_text("1111111")  # back: the job finishes on its revision
    assert bulkgen("run", *args).exit_code == 0


def linked_snapshots(hub, model_dir, revisions: dict[str, dict[str, bytes]]):
    """A Hub cache whose snapshots link to blobs, as huggingface_hub lays them out: each
    revision holds the model's files, with `changed` ones given their own blob."""
    repo = hub / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    for revision, changed in revisions.items():
        folder = repo / "snapshots" / revision
        folder.mkdir(parents=True)
        for f in model_dir.iterdir():
            blob = repo / "blobs" / (f.name + (f"-{revision}" if f.name in changed else ""))
            if not blob.exists():
                blob.write_bytes(changed.get(f.name, f.read_bytes()))
            (folder / f.name).symlink_to(os.path.relpath(blob, folder))
    (repo / "refs").mkdir()
    return repo


def test_a_rerun_on_a_revision_with_the_same_files_resumes(tmp_path, tiny_model_dir, monkeypatch):
    """A commit that changed only the model card moves refs/main; every file a run reads is
    the same blob: the job resumes (it was refused as two models' rows)."""
    repo = linked_snapshots(tmp_path / "hub", tiny_model_dir, {"1111111": {}, "2222222": {}})
    (repo / "snapshots" / "2222222" / "README.md").write_text("a new model card")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "a.jsonl").write_text(json.dumps({"prompt": "question"}) + "\n")
    args = [data, "-m", "org/tiny", "-o", out, "-q"]
    (repo / "refs" / "main").write_text("1111111")
    assert bulkgen("run", *args).exit_code == 0
    (repo / "refs" / "main").write_text("2222222")
    (data / "b.jsonl").write_text(json.dumps({"prompt": "another"}) + "\n")
    result = bulkgen("run", *args)
    assert result.exit_code == 0, result.output
    assert (out / "part-00001.parquet").exists()


def test_a_changed_or_removed_file_is_another_model(tmp_path, tiny_model_dir):
    config = (tiny_model_dir / "generation_config.json").read_bytes()
    repo = linked_snapshots(tmp_path / "hub", tiny_model_dir, {
        "a": {}, "b": {"generation_config.json": config.replace(b"}", b', "x": 1}')},
        "c": {}})  # fmt: skip
    (repo / "snapshots" / "c" / "tokenizer_config.json").unlink()
    old, changed, removed = (repo / "snapshots" / r for r in "abc")
    assert not same_files(old, changed) and not same_files(old, removed)
    assert same_files(old, old) and not same_files(old, tmp_path / "gone")
