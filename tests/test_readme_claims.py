"""What the README says about output order, sampling defaults and LLM.generate's prompts."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from click.testing import CliRunner

from bulkgen import LLM, SamplingParams
from bulkgen.cli import main
from bulkgen.run_config import RunConfig


def test_python_samples_at_temperature_1_and_the_cli_is_greedy():
    assert SamplingParams().temperature == 1.0
    assert RunConfig(inputs=("x.jsonl",), out="o", model="m").sampling.temperature == 0.0


def test_generate_takes_prompts_as_they_are_and_chat_applies_the_template(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    text = "Say hi."
    ids = llm.tokenizer.encode(text)  # the tokenizer's own defaults, no chat template
    as_text, as_ids = llm.generate([text, ids], greedy)
    assert as_text.token_ids == as_ids.token_ids
    templated = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    assert templated != text
    via_chat = llm.chat([[{"role": "user", "content": text}]], greedy)[0]
    rendered = llm.tokenizer.encode(templated, add_special_tokens=False)
    assert via_chat.token_ids == llm.generate([rendered], greedy)[0].token_ids


def test_output_rows_are_in_completion_order(tmp_path, tiny_model_dir):
    inp = tmp_path / "in.jsonl"
    rows = [{"id": "long", "prompt": "a", "max_tokens": 40}, {"id": "short", "prompt": "b",
            "max_tokens": 1}]  # fmt: skip
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(inp), "-m", str(tiny_model_dir), "-o", str(out),
                                       "--no-chat-template"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out / "part-00000.parquet").to_pylist()
    if rows[[r["id"] for r in rows].index("long")]["completion_tokens"] > 1:
        assert [r["id"] for r in rows] == ["short", "long"]  # not input order: join on id
