"""Shared fixtures: tiny random-weight models and a tokenizer trained here, nothing from the Hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pytest-xdist workers share the cores: each takes its part (before torch loads OpenMP, and for
# the runs the tests start), not torch's default of every core, whose threads wait for each other
# at every op while the other workers hold the cores (the thrashing test of test_admission.py:
# 1.8 s alone, 88 s beside another worker at 881429d). OMP_NUM_THREADS, when set, wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    from bulkgen.cpu import available_cores  # imports no torch

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, available_cores() // _WORKERS)))

import torch  # noqa: E402

if _WORKERS > 1:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# The files that take longest on a 2-core CPU, first, the Triton interpreter's alternating with
# those that start processes: pytest-xdist (--dist loadfile) hands out whole files, by default those
# with the most tests first, so one of these handed out last kept a worker busy long after the
# other had finished (test_parallel_ray.py's 3 tests, 110 s, at 881429d). The others keep their
# order.
SLOWEST_FILES = (
    "test_kv_layout.py",
    "test_parallel_ray.py",
    "test_kv_int8_kernels.py",
    "test_tensor_parallel.py",
    "test_invariant_attention.py",
    "test_resume.py",
    "test_triton_sampler.py",
    "test_parallel.py",
    "test_decode_prefetch.py",
    "test_parallel_kills.py",
    "test_mixed_split.py",
    "test_exits.py",
    "test_fp8_gemm.py",
    "test_kv_fp8_kernels.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist >= 3.8: hand out in this order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: files stay whole


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Continuous batching keeps the GPU busy while requests come and go.",
    "A paged KV cache stores keys and values in fixed-size blocks.",
    "Write a haiku about the sea. Explain photosynthesis to a child.",
    "What is the capital of France? Paris is the capital of France.",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000, dates 2024-01-01.",
    "Summarise the following text in one sentence, then list three keywords.",
    "Bonjour, comment allez-vous? Très bien, merci. ¿Qué tal? Gut, danke.",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB_SIZE = 384


def build_tokenizer(out_dir: Path):
    """A byte-level BPE trained on CORPUS, saved in Hugging Face format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def _config(arch: str, vocab_size: int, eos_id: int):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=eos_id,
        pad_token_id=0,
    )
    if arch == "llama":
        rope = dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )
        return LlamaConfig(**common, rope_scaling=rope, rope_theta=500000.0)
    if arch == "mistral":
        return MistralConfig(**common, sliding_window=None)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
    raise ValueError(arch)


ARCHS = ("llama", "mistral", "qwen2", "qwen3")


def build_model(arch: str, out_dir: Path) -> Path:
    """Random-weight tiny model of one architecture plus the shared tokenizer, in out_dir."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer(out_dir)
    config = _config(arch, VOCAB_SIZE, tokenizer.eos_token_id)
    torch.manual_seed(1234 + ARCHS.index(arch))
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: build_model(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_models) -> Path:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def allow_fp8(monkeypatch):
    """Let the fp8 KV cache run on the CPU (the test-only override of the hardware check)."""
    from bulkgen.model.attention import kv_fp8

    monkeypatch.setattr(kv_fp8, "fp8_supported", lambda device: True)


@pytest.fixture
def rowwise_interpreted_dots(monkeypatch):
    """Under TRITON_INTERPRET each tl.dot is one numpy matmul, and a BLAS may give a row different
    bits beside different neighbours (OpenBLAS 0.3.31 on an AMD EPYC does: a [32, 104] x [104, 16]
    float32 product's rows differ by up to 7e-6 with the rows reversed). Tests of which rows a
    kernel reads make each row of a tile its own product. Nothing changes on CUDA."""
    if torch.cuda.is_available():
        return
    import dataclasses

    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder

    whole_tile = InterpreterBuilder.create_dot

    def row_by_row(self, a, b, d, *precision):
        rows = [
            whole_tile(
                self,
                dataclasses.replace(a, data=a.data[..., i : i + 1, :]),
                b,
                dataclasses.replace(d, data=d.data[..., i : i + 1, :]),
                *precision,
            ).data
            for i in range(a.data.shape[-2])
        ]
        return dataclasses.replace(d, data=np.concatenate(rows, axis=-2))

    monkeypatch.setattr(InterpreterBuilder, "create_dot", row_by_row)


@pytest.fixture(scope="session")
def attention_compile_check(tmp_path_factory) -> str:
    """The output of scripts/compile_check_attention.py (every attention kernel compiled for
    sm_90 without a GPU), run once for the tests that read it: once a run, its pytest-xdist
    workers sharing it (each ran it, about 6 s, at 881429d)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _attention_compile_check()
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "attention_compile_check.txt"  # this run's
    with FileLock(f"{shared}.lock"):
        if not shared.exists():
            shared.write_text(_attention_compile_check())
        return shared.read_text()


def _attention_compile_check() -> str:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])  # this checkout
    script = root / "scripts" / "compile_check_attention.py"
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def table(tmp_path, monkeypatch):
    """Point the FP8 GEMM dispatch (fp8_gemm_table.py) at a table written by the test (None: no
    table file at all). Imported here, not at the top: a test file sets TRITON_INTERPRET first."""
    import json

    from bulkgen.model import fp8_gemm_table

    def clear() -> None:
        fp8_gemm_table.measured_choices.cache_clear()
        fp8_gemm_table.gemm_choice.cache_clear()
        fp8_gemm_table.tile_counters_needed.cache_clear()
        fp8_gemm_table.measured_silu.cache_clear()

    def write(shapes: dict | None, silu: dict | None = None) -> None:
        path = tmp_path / "fp8_gemm_table.json"
        if shapes is None:
            path.unlink(missing_ok=True)
        else:
            table = {"device": "test", "shapes": shapes} | ({"silu": silu} if silu else {})
            path.write_text(json.dumps(table))
        monkeypatch.setattr(fp8_gemm_table, "TABLE_FILE", path)
        clear()

    yield write
    clear()
