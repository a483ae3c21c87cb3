"""`bulkgen run` and `bulkgen models` as a user meets them: flags, one-line errors, exit codes."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Say hi.", "2+2="]


@pytest.fixture
def fake_engine(monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 2}))


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": p, "topic": i}) + "\n" for i, p in enumerate(PROMPTS))
    )
    return path


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_run_help_explains_every_flag():
    result = bulkgen("run", "--help")
    assert result.exit_code == 0
    for flag in ["--model", "--out", "--prompt-column", "--id-column", "--keep-columns",
                 "--format", "--shard-size", "--max-tokens", "--temperature", "--top-p",
                 "--top-k", "--min-p", "--seed", "--dtype", "--device", "--max-num-seqs",
                 "--max-batch-tokens", "--kv-memory", "--sync", "--quiet", "--overwrite",
                 "--chat-template", "--chat-template-file"]:  # fmt: skip
        assert flag in result.output
    assert "greedy" in result.output and "256" in result.output


def test_run_writes_shards_and_stats(tmp_path, prompts_file, tiny_model_dir, fake_engine):
    out = tmp_path / "out"
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", out,
                     "--keep-columns", "topic", "--shard-size", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 rows (0 errors) written" in result.stderr
    rows = pq.read_table(out / "part-00000.parquet").to_pylist()
    rows += pq.read_table(out / "part-00001.parquet").to_pylist()
    assert sorted(r["id"] for r in rows) == [f"prompts:{i}" for i in range(4)]
    assert {r["id"]: r["topic"] for r in rows}["prompts:2"] == 2
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rows"] == 4 and stats["sampling"]["temperature"] == 0.0


def test_quiet_prints_nothing(tmp_path, prompts_file, tiny_model_dir, fake_engine):
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q")
    assert result.exit_code == 0 and result.output == ""


def test_a_missing_prompt_column_is_one_line_and_no_shards(tmp_path, prompts_file, tiny_model_dir):
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", tmp_path / "out",
                     "--prompt-column", "question")  # fmt: skip
    line = one_error_line(result)
    assert "has no column 'question'" in line and "--prompt-column" in line
    assert not (tmp_path / "out").exists()


def test_a_bad_model_path_is_one_line_and_no_shards(tmp_path, prompts_file):
    result = bulkgen("run", prompts_file, "-m", tmp_path / "no-such-model", "-o", tmp_path / "out")
    assert "no-such-model" in one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_a_model_folder_without_weights_is_one_line(tmp_path, prompts_file):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    result = bulkgen("run", prompts_file, "-m", tmp_path / "m", "-o", tmp_path / "out")
    one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_input_is_one_line_and_no_shards(tmp_path, tiny_model_dir):
    (tmp_path / "data.parquet").write_bytes(b"this is not parquet")
    result = bulkgen("run", tmp_path / "data.parquet", "-m", tiny_model_dir, "-o", tmp_path / "out")
    assert "cannot read input" in one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_a_changed_job_is_refused_unless_overwritten(tmp_path, prompts_file, tiny_model_dir,
                                                     fake_engine):  # fmt: skip
    out = tmp_path / "out"
    assert bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", out, "-q").exit_code == 0
    changed = ("run", prompts_file, "-m", tiny_model_dir, "-o", out, "-q", "--temperature", "0.7")
    line = one_error_line(bulkgen(*changed))
    assert "sampling.temperature was 0.0, now 0.7" in line and "--overwrite" in line
    assert bulkgen(*changed, "--overwrite").exit_code == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["sampling"]["temperature"] == 0.7 and stats["rows"] == 4


def test_a_bad_flag_value_is_a_usage_error(tmp_path, prompts_file):
    result = bulkgen("run", prompts_file, "-o", tmp_path / "out", "--temperature", "-1")
    assert result.exit_code == 2 and "temperature must be >= 0" in result.output


@pytest.mark.parametrize("flag", ["--system", "--prompt-template", "--stop"])
def test_a_text_option_that_is_not_utf8_is_a_usage_error(tmp_path, prompts_file, flag):
    """A Latin-1 shell's "caf\\xe9" reaches Python as a lone surrogate: --system ended the run in
    a tokenizer traceback, --prompt-template made every row a row fault, --stop never matched."""
    value = "caf\udce9 {{ prompt }}"  # as Python decodes the bytes b"caf\xe9" from argv
    result = bulkgen("run", prompts_file, "-o", tmp_path / "out", flag, value)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{flag} holds" in result.output and "not valid UTF-8" in result.output
    assert not (tmp_path / "out").exists()


def test_models_lists_the_aliases():
    result = bulkgen("models")
    assert result.exit_code == 0
    assert "llama-8b" in result.output and "meta-llama/Llama-3.1-8B-Instruct" in result.output
    assert "smollm2-135m" in result.output and "(default)" in result.output


def test_run_gives_the_tokens_of_greedy_generate(tmp_path, prompts_file, tiny_model_dir,
                                                 tiny_tokenizer):  # fmt: skip
    """End to end on the real engine: the text of each row is transformers' greedy output."""
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    result = bulkgen("run", prompts_file, "-m", tiny_model_dir, "-o", out, "--max-tokens", "12",
                     "--format", "jsonl", "-q", "--device", "cpu")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {}
    for line in (out / "part-00000.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["id"]] = row
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for i, prompt in enumerate(PROMPTS):
        ids = tiny_tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True
        )["input_ids"]
        generated = model.generate(
            torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0
        )[0, len(ids) :].tolist()
        row = rows[f"prompts:{i}"]
        assert row["text"] == tiny_tokenizer.decode(generated, skip_special_tokens=True)
        assert (row["prompt_tokens"], row["completion_tokens"]) == (len(ids), len(generated))
        eos = tiny_tokenizer.eos_token_id
        assert row["finish_reason"] == ("stop" if generated[-1] == eos else "length")


@pytest.mark.slow
def test_the_default_model_answers_sensibly(tmp_path):
    """The demo model (fetched and converted on first use) through the whole command."""
    path = tmp_path / "q.jsonl"
    questions = ["What is the capital of France?", "What is 2 + 2?"]
    path.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in questions))
    result = bulkgen("run", path, "-o", tmp_path / "out", "--max-tokens", "48", "-q")
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "out" / "part-00000.parquet").to_pylist()}
    assert "Paris" in rows["q:0"]["text"]
    assert "4" in rows["q:1"]["text"]
    assert all(r["finish_reason"] == "stop" for r in rows.values())


def test_an_over_long_prompt_is_an_error_record_from_the_real_engine(tmp_path, tiny_model_dir):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "word " * 600}) + "\n" + json.dumps({"prompt": "hi"}))
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", tmp_path / "out", "-q",
                     "--max-tokens", "3", "--device", "cpu")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "out" / "part-00000.parquet").to_pylist()}
    assert rows["p:0"]["finish_reason"] == "error" and "context" in rows["p:0"]["error"]
    assert rows["p:1"]["finish_reason"] == "length" and rows["p:1"]["completion_tokens"] == 3


def test_an_empty_input_finishes_with_no_shards(tmp_path, tiny_model_dir, fake_engine):
    (tmp_path / "empty.jsonl").write_text("")
    result = bulkgen("run", tmp_path / "empty.jsonl", "-m", tiny_model_dir, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert not list((tmp_path / "out").glob("part-*"))
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["rows"] == 0


def test_max_model_len_bounds_prompts_and_dummy_weights_need_no_weight_files(
    tmp_path, tiny_model_dir
):
    import shutil

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "word " * 20}) + "\n" + json.dumps({"prompt": "hi"}))
    shape_only = tmp_path / "shape-only"  # config and tokenizer, no safetensors
    shutil.copytree(tiny_model_dir, shape_only, ignore=shutil.ignore_patterns("*.safetensors"))
    result = bulkgen("run", path, "-m", shape_only, "-o", tmp_path / "out", "-q",
                     "--max-tokens", "3", "--device", "cpu", "--max-model-len", "12",
                     "--load-format", "dummy")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "out" / "part-00000.parquet").to_pylist()}
    assert rows["p:0"]["finish_reason"] == "error" and "12 tokens" in rows["p:0"]["error"]
    assert rows["p:1"]["finish_reason"] == "length" and rows["p:1"]["completion_tokens"] == 3
    # Without --load-format dummy the same folder is refused for having no weights.
    result = bulkgen("run", path, "-m", shape_only, "-o", tmp_path / "out2", "--device", "cpu")
    one_error_line(result)
