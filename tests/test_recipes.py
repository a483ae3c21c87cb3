"""Recipes: YAML files of `bulkgen run` options; flags override them; paths are the recipe's."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.cli import run as run_command
from bulkgen.engine.fake import FAKE_ENGINE_ENV
from bulkgen.recipes import load_recipe


def write_recipe(folder, fields, name="job.yaml"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.fixture
def fake_engine(monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1}))


@pytest.fixture
def recipe_dir(tmp_path):
    """A recipe folder with a topics table, as a shipped recipe has."""
    folder = tmp_path / "recipes"
    (folder / "data").mkdir(parents=True)
    topics = ["tides", "rust", "bread"]
    (folder / "data" / "topics.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "topic": t}) + "\n" for i, t in enumerate(topics))
    )
    return folder


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_fields_are_the_run_flags_with_underscores(tmp_path):
    path = write_recipe(tmp_path, {
        "max_tokens": 7, "temperature": 0.5, "keep_columns": ["topic", "level"],
        "format": "jsonl", "sync": True, "chat_template": False, "model": "smollm2-135m",
        "batch_invariant": True,
    })  # fmt: skip
    options = load_recipe(path, run_command).options
    assert options["max_tokens"] == 7 and options["temperature"] == 0.5
    assert options["keep_columns"] == "topic,level"
    assert options["fmt"] == "jsonl"  # the --format flag's parameter
    assert options["sync"] is True and options["chat_template"] is False
    assert options["model"] == "smollm2-135m"  # an alias, not a path
    assert options["batch_invariant"] is True


def test_relative_paths_resolve_against_the_recipes_folder(tmp_path):
    folder = tmp_path / "recipes"
    (folder / "models" / "m").mkdir(parents=True)
    path = write_recipe(folder, {
        "inputs": ["data/a.jsonl", "/abs/b.jsonl"], "out": "../results/x",
        "prompt_template": "@templates/t.j2", "model": "models/m",
        "score": {"baseline": "../results/yesterday", "references": "data/eval.jsonl"},
    })  # fmt: skip
    recipe = load_recipe(path, run_command)
    options = recipe.options
    assert recipe.score == {"reference_column": "answer",
                            "baseline": str(tmp_path / "results" / "yesterday"),
                            "references": str(folder / "data" / "eval.jsonl")}  # fmt: skip
    assert options["inputs"] == [str(folder / "data" / "a.jsonl"), "/abs/b.jsonl"]
    assert options["out"] == str(tmp_path / "results" / "x")
    assert options["prompt_template"] == "@" + str(folder / "templates" / "t.j2")
    assert options["model"] == str(folder / "models" / "m")


def test_a_single_input_may_be_a_string(tmp_path):
    path = write_recipe(tmp_path, {"input": "a.jsonl"})
    assert load_recipe(path, run_command).options["inputs"] == [str(tmp_path / "a.jsonl")]


def test_an_inline_prompt_template_is_kept_as_it_is(tmp_path):
    path = write_recipe(tmp_path, {"prompt_template": "Explain {{ topic }}.\n"})
    assert load_recipe(path, run_command).options["prompt_template"] == "Explain {{ topic }}.\n"


def test_a_recipe_runs_with_its_own_inputs_template_and_out(recipe_dir, tiny_model_dir,
                                                             fake_engine):  # fmt: skip
    path = write_recipe(recipe_dir, {
        "description": "topics into questions",
        "inputs": "data/topics.jsonl", "out": "../results/topics", "model": str(tiny_model_dir),
        "prompt_template": "Ask a question about {{ topic }}.", "keep_columns": ["topic"],
        "max_tokens": 5,
    })  # fmt: skip
    result = bulkgen("run", "--recipe", path, "-q")
    assert result.exit_code == 0, result.output
    out = recipe_dir.parent / "results" / "topics"
    rows = {r["id"]: r for r in pq.read_table(out / "part-00000.parquet").to_pylist()}
    assert rows["t1"]["prompt"] == "Ask a question about rust." and rows["t1"]["topic"] == "rust"
    assert all(r["completion_tokens"] <= 5 for r in rows.values())


def test_flags_override_the_recipes_fields(recipe_dir, tmp_path, tiny_model_dir, fake_engine):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x", "topic": "kites"}) + "\n")
    path = write_recipe(recipe_dir, {
        "inputs": "data/topics.jsonl", "out": "../results/topics", "model": "no-such-model",
        "prompt_template": "Ask about {{ topic }}.", "max_tokens": 50, "format": "parquet",
    })  # fmt: skip
    out = tmp_path / "mine"
    result = bulkgen("run", "--recipe", path, other, "-o", out, "-m", tiny_model_dir,
                     "--max-tokens", "2", "--format", "jsonl", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "part-00000.jsonl").read_text().splitlines()]
    assert [(r["id"], r["prompt"]) for r in rows] == [("x", "Ask about kites.")]
    assert rows[0]["completion_tokens"] <= 2
    assert not (recipe_dir.parent / "results").exists()


@pytest.mark.parametrize(
    "answers_from",
    [{"keep_columns": "answer"}, {"score": {"references": "q.jsonl"}}],
    ids=["kept-column", "references-file"],
)
def test_a_recipes_score_section_scores_the_run(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                monkeypatch, answers_from):  # fmt: skip
    # Every row answers "4": right for the first question, wrong for the second.
    four = tiny_tokenizer.encode("4", add_special_tokens=False)
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 1, "tokens": four}))
    questions = [("q1", "2+2?", "4"), ("q2", "2+3?", "5")]
    (tmp_path / "q.jsonl").write_text("".join(
        json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in questions
    ))  # fmt: skip
    path = write_recipe(tmp_path, {
        "inputs": "q.jsonl", "out": "out", "model": str(tiny_model_dir),
        "prompt_template": "{{ question }}", "score": {"reference_column": "answer"},
        **answers_from,
    })  # fmt: skip
    result = bulkgen("run", "--recipe", path)
    assert result.exit_code == 0, result.output
    assert "accuracy 50.0% (1/2 correct" in result.stderr
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["rows"] == 2  # the run's own stats are kept
    assert stats["score"]["accuracy"] == 0.5 and stats["score"]["correct"] == 1


def test_a_recipe_runs_end_to_end_on_a_real_model(recipe_dir, tmp_path, tiny_model_dir):
    """The real engine (tiny model, CPU): --model overrides the recipe's default model."""
    path = write_recipe(recipe_dir, {
        "inputs": "data/topics.jsonl", "out": "../results/real", "model": "smollm2-135m",
        "device": "cpu", "prompt_template": "Write about {{ topic }}.", "max_tokens": 4,
        "temperature": 0.8, "seed": 1, "keep_columns": "topic",
    })  # fmt: skip
    result = bulkgen("run", "--recipe", path, "--model", tiny_model_dir, "-q")
    assert result.exit_code == 0, result.output
    out = recipe_dir.parent / "results" / "real"
    rows = pq.read_table(out / "part-00000.parquet").to_pylist()
    assert sorted(r["topic"] for r in rows) == ["bread", "rust", "tides"]
    assert all(r["error"] is None and 1 <= r["completion_tokens"] <= 4 for r in rows)
    recorded = json.loads((out / "job.json").read_text())
    assert recorded["settings"]["model"] == str(tiny_model_dir)
    assert recorded["settings"]["sampling"]["temperature"] == 0.8


SHIPPED = os.path.join(os.path.dirname(__file__), os.pardir, "recipes")


@pytest.mark.parametrize("name", ["synthetic-instructions.yaml", "nightly-eval.yaml"])
def test_the_shipped_recipes_load(name):
    recipe = load_recipe(os.path.join(SHIPPED, name), run_command)
    for source in recipe.options["inputs"]:
        assert os.path.isfile(source)
    template = recipe.options["prompt_template"]
    assert not template.startswith("@") or os.path.isfile(template[1:])


def shipped_rows(name, ids, tmp_path):
    """A few rows of a shipped data file, as a file of their own."""
    lines = open(os.path.join(SHIPPED, "data", name)).read().splitlines()
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines if json.loads(line)["id"] in ids))
    return path


@pytest.mark.slow
def test_the_nightly_eval_recipe_scores_the_default_model(tmp_path):
    ids = ["capital-france", "red-planet", "spider-legs", "add-2-2"]
    questions = shipped_rows("eval-questions.jsonl", ids, tmp_path)
    out = tmp_path / "eval"
    recipe = os.path.join(SHIPPED, "nightly-eval.yaml")
    result = bulkgen("run", "--recipe", recipe, questions, "-o", out)
    assert result.exit_code == 0, result.output
    score = json.loads((out / "stats.json").read_text())["score"]
    assert score["n"] == 4 and score["correct"] >= 3  # the model knows these
    assert f"accuracy {score['accuracy']:.1%}" in result.stderr


@pytest.mark.slow
def test_the_synthetic_instructions_recipe_loads_as_a_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    topics = shipped_rows("topics.jsonl", ["topic-00", "topic-03"], tmp_path)
    out = tmp_path / "synthetic"
    recipe = os.path.join(SHIPPED, "synthetic-instructions.yaml")
    result = bulkgen("run", "--recipe", recipe, topics, "-o", out, "--max-tokens", "48", "-q")
    assert result.exit_code == 0, result.output
    files = str(out / "part-*.parquet")
    ds = datasets.load_dataset("parquet", data_files=files, split="train")
    assert ds.num_rows == 4 and {"prompt", "text", "sample", "topic", "task"} <= set(ds.features)
    pairs = {(r["id"], r["sample"]) for r in ds}
    assert pairs == {("topic-00", 0), ("topic-00", 1), ("topic-03", 0), ("topic-03", 1)}
    by_id = {r["id"]: r for r in ds}
    assert by_id["topic-03"]["prompt"] == "Give three practical tips about budgeting for students."
    assert all(r["error"] is None and r["text"] for r in ds)


def test_options_added_to_run_are_fields_too(tmp_path):
    """Fields come from the command's own parameters: the generation flags need no code here."""
    path = write_recipe(tmp_path, {"n": 3, "stop": "###", "system": "Be brief."})
    options = load_recipe(path, run_command).options
    assert options["n"] == 3 and options["stop"] == ["###"] and options["system"] == "Be brief."
    path = write_recipe(tmp_path, {"stop": ["###", "\n\n"]})
    assert load_recipe(path, run_command).options["stop"] == ["###", "\n\n"]


@pytest.mark.parametrize(
    "flags, field",
    [
        (["--json"], "json_schema"),
        (["--regex", "[a-z]+"], "regex"),
        (["--choice", "yes"], "choice"),
    ],
)
def test_a_constraint_flag_replaces_the_recipes_constraint(
    recipe_dir, tmp_path, tiny_model_dir, fake_engine, flags, field
):
    """A recipe's json_schema and a --json / --regex / --choice on the command line: the flag
    overrides the field, as every flag does (it was "--json-schema and --json cannot be
    combined", exit 2); two constraint flags on the command line are still refused."""
    path = write_recipe(recipe_dir, {
        "inputs": "data/topics.jsonl", "model": str(tiny_model_dir), "max_tokens": 2,
        "prompt_template": "Ask about {{ topic }}.", "format": "jsonl",
        "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    })  # fmt: skip
    out = tmp_path / "out"
    result = bulkgen("run", "--recipe", path, "-o", out, "-q", *flags)
    assert result.exit_code == 0, result.output
    sampling = json.loads((out / "job.json").read_text())["settings"]["sampling"]
    assert sampling[field] and "integer" not in (sampling.get("json_schema") or "")
    both = bulkgen("run", "--recipe", path, "-o", tmp_path / "o2", "--json", "--regex", "a")
    assert both.exit_code == 2 and "cannot be combined" in both.output
