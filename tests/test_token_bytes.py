"""--format openai logprobs: each token's `bytes` are its own, so a character split over tokens
joins back, and completions' text_offset counts that character once."""

from __future__ import annotations

import pytest
from test_openai_batch import read_batch_output
from test_pipeline import make_config, write_jsonl

from bulkgen.config import SamplingParams
from bulkgen.engine.token_logprobs import TokenLogprobs
from bulkgen.io.openai import output_line
from bulkgen.pipeline import run
from bulkgen.row import Row
from bulkgen.text.stage import Detokenize
from bulkgen.text.token_bytes import TokenBytes

TEXT = "ü€"  # 2 and 3 bytes in UTF-8; neither is in the tiny vocabularies as one token


@pytest.fixture(scope="module")
def sentencepiece_tokenizer():
    """A Llama-2-style SentencePiece BPE: '▁' for spaces, <0xNN> tokens for bytes not in the
    vocabulary (byte fallback), decoded by Llama-2's decoder sequence."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ("▁", "a", "b", "▁a", "é"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [("▁", "a")], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        + [decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def spelled_row(tokenizer, text: str, api: str) -> tuple[Row, list[int]]:
    """A generated row whose tokens spell text, each its own top entry beside the token after it
    in the vocabulary, named by the detokenizer as a run names them."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    row = Row(id="a", prompt="p", prompt_text="xy", token_ids=ids, api=api)
    row.finish_reason = "length"
    pairs = [[(i, -0.5), (i + 1, -1.0)] for i in ids]
    row.token_logprobs = TokenLogprobs.from_pairs([-0.5] * len(ids), pairs, 2)
    Detokenize(tokenizer)([row])
    return row, ids


def choice(row: Row, tokenizer) -> dict:
    line = output_line([row], "m", 0, token_bytes=TokenBytes(tokenizer))
    return line["response"]["body"]["choices"][0]


def test_byte_level_pieces_of_characters_join_back(tiny_tokenizer):
    row, ids = spelled_row(tiny_tokenizer, TEXT, "chat")
    assert len(ids) == 5 and "\ufffd" in row.token_texts  # one byte a token, each alone U+FFFD
    content = choice(row, tiny_tokenizer)["logprobs"]["content"]
    assert b"".join(bytes(t["bytes"]) for t in content) == TEXT.encode()
    own = [t["bytes"] for t in content]
    assert [t["top_logprobs"][0]["bytes"] for t in content] == own  # the same ids, same bytes
    assert all(len(t["top_logprobs"][1]["bytes"]) == 1 for t in content)  # byte tokens' neighbours


def test_sentencepiece_byte_fallback_pieces_join_back(sentencepiece_tokenizer):
    tokenizer = sentencepiece_tokenizer
    row, ids = spelled_row(tokenizer, "a€é", "chat")
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert pieces == ["▁a", "<0xE2>", "<0x82>", "<0xAC>", "é"]
    content = choice(row, tokenizer)["logprobs"]["content"]
    assert [t["bytes"] for t in content[1:4]] == [[0xE2], [0x82], [0xAC]]
    assert b"".join(bytes(t["bytes"]) for t in content[1:]) == "€é".encode()
    assert content[0]["bytes"] == list(b" a")  # "▁a": its space (decoded alone it has none)
    assert content[4]["bytes"] == list("é".encode())  # a whole character's token: its text's


def test_completion_text_offsets_count_a_split_character_once(tiny_tokenizer):
    row, _ = spelled_row(tiny_tokenizer, TEXT, "text")
    logprobs = choice(row, tiny_tokenizer)["logprobs"]
    # prompt "xy": ü starts at 2 (its 2 bytes' tokens), € at 3 (its 3 bytes' tokens)
    assert logprobs["text_offset"] == [2, 2, 3, 3, 3]
    # Pieces of a character are named by their bytes, as OpenAI names them, so the top
    # alternatives (each piece and the token after it, both U+FFFD alone) keep both entries.
    spelled = [f"bytes:\\x{b:02x}" for b in TEXT.encode()]
    assert logprobs["tokens"] == spelled
    assert [list(top)[0] for top in logprobs["top_logprobs"]] == spelled
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])


def test_a_run_writes_each_tokens_own_bytes(tmp_path, tiny_model_dir):
    """End to end: a chat and a completions request forced to spell TEXT."""
    path = write_jsonl(tmp_path / "batch.jsonl", [
        {"custom_id": "chat", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Say it"}]}},
        {"custom_id": "text", "url": "/v1/completions", "body": {"prompt": "Say it"}},
    ])  # fmt: skip
    sampling = SamplingParams(max_tokens=8, regex=TEXT, logprobs=1)
    run(make_config(tmp_path, tiny_model_dir, [path], format="openai", sampling=sampling))
    results = read_batch_output(tmp_path / "out")
    [chat] = results["chat"]["response"]["body"]["choices"]
    assert chat["message"]["content"] == TEXT
    content = chat["logprobs"]["content"]
    assert b"".join(bytes(t["bytes"]) for t in content) == TEXT.encode()
    [text] = results["text"]["response"]["body"]["choices"]
    assert text["text"] == TEXT and len(text["logprobs"]["tokens"]) == 5  # a byte a token
    assert text["logprobs"]["text_offset"] == [6, 6, 7, 7, 7]  # after the prompt "Say it"


def test_sentencepiece_offsets_and_names_keep_the_spaces_text_keeps(sentencepiece_tokenizer):
    """'▁a ▁a' decodes to 'a a' (the decoder strips the completion's first space): the first
    token starts at 2 and the second at its space, 3 (it read 4: every offset after the first
    one high); a word-initial token is named with its space (' a', as its bytes say), so the
    alternatives '▁a' and 'a' are two top_logprobs keys (they collided on 'a': one was lost)."""
    tokenizer = sentencepiece_tokenizer
    a, word_a = tokenizer.convert_tokens_to_ids(["a", "▁a"])
    ids = [word_a, word_a]
    tops = [[(word_a, -0.5), (a, -1.0)] for _ in ids]
    rows = {}
    for api in ("text", "chat"):
        rows[api] = Row(id="a", prompt="xy", prompt_text="xy", token_ids=ids, api=api)
        rows[api].finish_reason = "length"
        rows[api].token_logprobs = TokenLogprobs.from_pairs([-0.5] * 2, tops, 2)
        Detokenize(tokenizer)([rows[api]])
    assert rows["text"].text == "a a"
    completion = choice(rows["text"], tokenizer)["logprobs"]
    assert completion["text_offset"] == [2, 3]
    assert all(len(top) == 2 for top in completion["top_logprobs"])
    assert list(completion["top_logprobs"][1]) == [" a", "a"]
    content = choice(rows["chat"], tokenizer)["logprobs"]["content"]
    for entry in content:
        assert entry["token"].encode() == bytes(entry["bytes"]) == b" a"
        assert [t["token"] for t in entry["top_logprobs"]] == [" a", "a"]


def test_sentencepiece_names_in_parquet_and_jsonl_keep_the_space(sentencepiece_tokenizer):
    """The logprobs a Parquet or JSONL row stores name each top entry as the run's detokenizer
    does (pipeline.py: TokenBytes.name): the word-initial '▁a' is ' a', apart from 'a' (both
    were 'a', as vLLM's names in context are not); a byte piece keeps its U+FFFD text."""
    tokenizer = sentencepiece_tokenizer
    a, word_a = tokenizer.convert_tokens_to_ids(["a", "▁a"])
    byte = tokenizer.convert_tokens_to_ids("<0xE2>")
    row = Row(id="a", prompt="xy", prompt_text="xy", token_ids=[word_a, a])
    row.finish_reason = "length"
    tops = [[(word_a, -0.5), (a, -1.0)], [(a, -0.2), (byte, -3.0)]]
    row.token_logprobs = TokenLogprobs.from_pairs([-0.5, -0.2], tops, 2)
    Detokenize(tokenizer, TokenBytes(tokenizer).name)([row])
    names = [[entry["token"] for entry in position] for position in row.top_dicts()]
    assert names == [[" a", "a"], ["a", "\ufffd"]]
    assert row.token_texts == [" a", "a"]
    unnamed = Row(id="b", prompt="xy", prompt_text="xy", token_ids=[word_a, a])
    unnamed.token_logprobs = TokenLogprobs.from_pairs([-0.5, -0.2], tops, 2)
    Detokenize(tokenizer)([unnamed])  # without a name function: each text alone
    assert unnamed.top_dicts()[0][0]["token"] == "a"


def test_a_parquet_run_names_top_entries_with_their_bytes(
    tmp_path, tiny_model_dir, sentencepiece_tokenizer
):
    """End to end through a run and the Parquet writer, the tiny model speaking through the
    SentencePiece tokenizer (its vocabulary is inside the model's) and held to 'a a': the
    word-initial token is stored as ' a', with its space."""
    import json
    import shutil

    import pyarrow.parquet as pq

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)
    sentencepiece_tokenizer.save_pretrained(model)
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "r", "prompt": "b"}])
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    sampling = SamplingParams(max_tokens=4, regex="a a", logprobs=vocab)  # every token a position
    config = make_config(tmp_path, model, [path], sampling=sampling, chat_template=False)
    run(config)
    [shard] = sorted((tmp_path / "out").glob("*.parquet"))
    [row] = pq.read_table(shard).to_pylist()
    assert row["text"] == "a a"
    word_a = sentencepiece_tokenizer.convert_tokens_to_ids("▁a")
    for position in row["top_logprobs"]:
        names = {entry["token_id"]: entry["token"] for entry in position}
        assert names[word_a] == " a" and names[word_a + 1] == "é"  # (it was 'a')
