"""A model's generation_config.json: its sampling is LLM.generate's default, as in vLLM."""

from __future__ import annotations

import json
import shutil

from bulkgen import LLM, SamplingParams

RECOMMENDED = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
               "repetition_penalty": 1.05, "max_new_tokens": 8}  # fmt: skip


def model_with_generation_config(tmp_path, tiny_model_dir, fields: dict):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return folder


def recorded_params(llm: LLM) -> list[SamplingParams]:
    added, add = [], llm.engine.add
    llm.engine.add = lambda name, ids, params: (added.append(params), add(name, ids, params))[1]
    return added


def test_generate_and_chat_without_params_sample_as_the_generation_config_says(
    tmp_path, tiny_model_dir
):
    llm = LLM(str(model_with_generation_config(tmp_path, tiny_model_dir, RECOMMENDED)),
              device="cpu")  # fmt: skip
    expected = SamplingParams(max_tokens=8, temperature=0.6, top_p=0.9, top_k=20,
                              repetition_penalty=1.05)  # fmt: skip
    assert llm.default_sampling_params() == expected
    added = recorded_params(llm)
    out = llm.generate(["The quick brown fox"])[0]
    llm.chat([{"role": "user", "content": "Hello"}])
    assert added == [expected, expected]
    assert len(out.token_ids) <= 8


def test_params_given_are_used_as_they_are(tmp_path, tiny_model_dir):
    llm = LLM(str(model_with_generation_config(tmp_path, tiny_model_dir, RECOMMENDED)),
              device="cpu")  # fmt: skip
    added = recorded_params(llm)
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    llm.generate(["The quick brown fox"], greedy)
    assert added == [greedy]


def test_a_generation_config_without_sampling_fields_leaves_the_defaults(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu")  # its generation_config names eos and pad only
    assert llm.default_sampling_params() == SamplingParams()


def test_transformers_defaults_in_the_file_are_no_choice(tmp_path, tiny_model_dir):
    """As vLLM (to_diff_dict): a file's values equal to transformers' GenerationConfig defaults
    (top_k 50, temperature 1.0, top_p 1.0, repetition_penalty 1.0) are left out."""
    fields = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0,
              "min_p": 0.05}  # fmt: skip
    folder = model_with_generation_config(tmp_path, tiny_model_dir, fields)
    assert LLM(str(folder), device="cpu").default_sampling_params() == SamplingParams(min_p=0.05)
