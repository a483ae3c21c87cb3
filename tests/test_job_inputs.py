"""Changed inputs, --limit, repeated header names and kept columns, as a user of `bulkgen run` meets
them (CSV and TSV inputs: test_csv_inputs.py)."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bulkgen.cli import main
from bulkgen.engine.fake import FAKE_ENGINE_ENV


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, json.dumps({"steps": 2}))


def bulkgen(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def output(out) -> list[dict]:
    return [r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def write_prompts(path, count: int) -> None:
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(count)))


def test_a_changed_input_is_refused_unless_allowed_or_overwritten(tmp_path, tiny_model_dir):
    path, out = tmp_path / "in.jsonl", tmp_path / "out"
    write_prompts(path, 6)
    args = [path, "-m", tiny_model_dir, "-o", out, "-q", "--shard-size", "2"]
    assert bulkgen("run", *args).exit_code == 0
    recorded = json.loads((out / "job.json").read_text())["input_files"][str(path.resolve())]
    assert recorded["size"] == path.stat().st_size and len(recorded["edges"]) == 32
    assert bulkgen("run", *args).exit_code == 0  # unchanged: resumes (nothing left)
    write_prompts(path, 8)  # two rows added
    result = bulkgen("run", *args)
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "\n" not in line and f"input {path.resolve()} changed since the job" in line
    assert "--overwrite" in line and "--allow-changed-input" in line
    assert bulkgen("run", *args, "--allow-changed-input").exit_code == 0
    assert sorted(r["id"] for r in output(out)) == sorted(f"in:{i}" for i in range(8))
    assert bulkgen("run", *args).exit_code == 0  # the allowed change is the new reference
    os.utime(path, ns=(0, 0))  # touched: a change too (the content could differ mid-file)
    assert "changed since" in bulkgen("run", *args).stderr


def test_an_input_named_otherwise_than_before_is_refused_not_generated_again(
    tmp_path, tiny_model_dir
):
    """`run data` then `run data/sub/a.jsonl`: the same file, whose rows' default ids would be
    'a:<row>' instead of 'sub/a:<row>'."""
    (tmp_path / "data" / "sub").mkdir(parents=True)
    path, out = tmp_path / "data" / "sub" / "a.jsonl", tmp_path / "out"
    write_prompts(path, 3)
    args = ["-m", tiny_model_dir, "-o", out, "-q"]
    assert bulkgen("run", tmp_path / "data", *args).exit_code == 0
    for extra in ([], ["--allow-changed-input"]):
        result = bulkgen("run", path, *args, *extra)
        assert result.exit_code == 1
        assert "gave the job in" in result.stderr and "'sub/a:<row>'" in result.stderr
        assert "'a:<row>'" in result.stderr
    assert sorted(r["id"] for r in output(out)) == [f"sub/a:{i}" for i in range(3)]
    assert bulkgen("run", tmp_path / "data", *args).exit_code == 0  # as before: resumes
    assert bulkgen("run", path, *args, "--overwrite").exit_code == 0
    assert sorted(r["id"] for r in output(out)) == [f"a:{i}" for i in range(3)]


def test_an_allowed_change_to_a_finished_job_is_the_new_reference(tmp_path, tiny_model_dir):
    path, out = tmp_path / "in.jsonl", tmp_path / "out"
    write_prompts(path, 4)
    args = [path, "-m", tiny_model_dir, "-o", out, "-q"]
    assert bulkgen("run", *args).exit_code == 0
    os.utime(path, ns=(0, 0))  # changed, but every row is still done: nothing to generate
    assert "changed since" in bulkgen("run", *args).stderr  # refused before "nothing to do"
    allowed = bulkgen("run", *args, "--allow-changed-input")
    assert allowed.exit_code == 0 and "nothing to generate" in allowed.stderr
    rerun = bulkgen("run", *args)
    assert rerun.exit_code == 0 and "nothing to generate" in rerun.stderr
    assert len(output(out)) == 4


def test_limit_runs_the_first_rows_and_is_part_of_the_job(tmp_path, tiny_model_dir):
    path, out = tmp_path / "in.jsonl", tmp_path / "out"
    write_prompts(path, 10)
    args = [path, "-m", tiny_model_dir, "-o", out, "-q"]
    assert bulkgen("run", *args, "--limit", "3").exit_code == 0
    assert sorted(r["id"] for r in output(out)) == ["in:0", "in:1", "in:2"]
    assert json.loads((out / "job.json").read_text())["settings"]["limit"] == 3
    result = bulkgen("run", *args, "--limit", "5")
    assert result.exit_code == 1 and "limit was 3, now 5" in result.stderr
    assert bulkgen("run", *args, "--limit", "5", "--overwrite").exit_code == 0
    assert len(output(out)) == 5
    assert bulkgen("run", *args, "--limit", "0").exit_code == 2


@pytest.mark.parametrize("name", ["in.csv", "in.parquet"])
def test_a_column_named_twice_in_a_header_is_one_line_before_any_work(
    tmp_path, tiny_model_dir, name
):
    path, out = tmp_path / name, tmp_path / "out"
    if name.endswith(".csv"):
        path.write_text("id,prompt,prompt,x,x\na,Hello,World,1,2\n")
    else:
        import pyarrow as pa

        arrays = [pa.array(v) for v in (["a"], ["Hello"], ["World"], ["1"], ["2"])]
        pq.write_table(pa.Table.from_arrays(arrays, ["id", "prompt", "prompt", "x", "x"]), path)
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "-q")
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"error: {path} names the column(s) 'prompt' more than once in its header; rename or "
        "drop the repeats"
    )  # x, repeated too, is not read
    assert not out.exists()


def test_a_kept_column_named_twice_is_refused(tmp_path, tiny_model_dir):
    path = tmp_path / "in.jsonl"
    write_prompts(path, 1)
    result = bulkgen(
        "run", path, "-m", tiny_model_dir, "-o", tmp_path / "out", "--keep-columns", "a,a"
    )
    assert result.exit_code == 2
    assert "--keep-columns names 'a' twice" in result.output


def test_more_logprobs_than_the_vocabulary_is_one_line_before_any_work(tmp_path, tiny_model_dir):
    path = tmp_path / "in.jsonl"
    write_prompts(path, 1)
    out = tmp_path / "out"
    result = bulkgen("run", path, "-m", tiny_model_dir, "-o", out, "--logprobs", 10**6)
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("error: --logprobs 1000000 is more than the model's")
    assert not (out / "job.json").exists()


def test_a_job_recorded_by_another_run_after_the_check_is_refused_under_the_lock(tmp_path):
    # Run B checks an empty folder, then loads its model; run A records a job there meanwhile.
    # B must refuse A's settings once it holds the lock, not resume A's rows with its own.
    from test_writer import done_rows

    from bulkgen.errors import UserError
    from bulkgen.io.job import JobDir
    from bulkgen.io.writer import ShardWriter

    out = tmp_path / "out"
    settings_a, settings_b = {"sampling": {"max_tokens": 1}}, {"sampling": {"max_tokens": 12}}
    inputs = {"/data/a.jsonl": {"source": "a"}}
    run_b = JobDir(out)
    run_b.check(settings_b, overwrite=False)  # nothing recorded yet
    run_a = JobDir(out)
    run_a.lock()
    run_a.prepare({"settings": settings_a, "input_files": inputs}, overwrite=False)
    ShardWriter(out, "parquet", 1).add(done_rows(1))  # A wrote a row
    run_a.unlock()
    run_b.lock()
    with pytest.raises(UserError, match=r"other settings \(sampling.max_tokens was 1, now 12\)"):
        run_b.prepare({"settings": settings_b, "input_files": inputs}, overwrite=False)
    renamed = {"/data/a.jsonl": {"source": "data/a"}}
    with pytest.raises(UserError, match="as named now it gives 'data/a:<row>'"):
        run_b.prepare({"settings": settings_a, "input_files": renamed}, overwrite=False)
    run_b.prepare({"settings": settings_a, "input_files": inputs}, overwrite=False)  # the same
    run_b.unlock()


def test_kept_columns_with_the_openai_format_are_refused_in_one_line(tmp_path, tiny_model_dir):
    """Batch output lines hold no input column: they were accepted and silently dropped."""
    write_prompts(tmp_path / "in.jsonl", 2)
    result = bulkgen("run", tmp_path / "in.jsonl", "-m", tiny_model_dir, "-o", tmp_path / "out",
                     "--format", "openai", "--keep-columns", "prompt2")  # fmt: skip
    assert result.exit_code == 2 and "--keep-columns with --format openai" in result.output
    assert not (tmp_path / "out").exists()


def test_an_input_changed_before_another_run_wrote_its_first_shard_is_refused_under_the_lock(
    tmp_path, tiny_model_dir
):
    # Run A starts on in.jsonl; the file is replaced and run B starts into the same folder while
    # A has written nothing, so B's check before its model loads passes. A ends while B loads.
    # Holding the lock, B must refuse the changed file, not resume A's rows with the new ones.
    import dataclasses

    from bulkgen.engine.fake import FakeEngine
    from bulkgen.errors import UserError
    from bulkgen.pipeline import run
    from bulkgen.run_config import RunConfig

    path, out = tmp_path / "in.jsonl", tmp_path / "out"
    write_prompts(path, 4)
    config = RunConfig(inputs=(str(path),), out=str(out), model=str(tiny_model_dir), quiet=True)

    def load_while_a_runs(engine_config):
        run(config, lambda c: FakeEngine(c, steps=1))  # A: the 4 rows of the first file
        path.write_text("".join(json.dumps({"prompt": f"other {i}"}) + "\n" for i in range(6)))
        return FakeEngine(engine_config, steps=1)

    with pytest.raises(UserError, match=f"input {path.resolve()} changed since the job"):
        run(config, load_while_a_runs)  # B
    assert sorted(r["prompt"] for r in output(out)) == [f"question {i}" for i in range(4)]
    allowed = dataclasses.replace(config, allow_changed_input=True)
    run(allowed, lambda c: FakeEngine(c, steps=1))  # allowed: resumed by id, as documented
    assert sorted(r["id"] for r in output(out)) == [f"in:{i}" for i in range(6)]
