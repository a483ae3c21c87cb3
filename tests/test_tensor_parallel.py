"""--tensor-parallel N: the model split over N processes joined by torch.distributed (gloo on the
CPU, which is how these tests run it), one scheduler on rank 0, the other ranks replaying its steps.

The oracle is the same engine in one process: split weights add the same products in another order
(each rank's partial sum, then the all-reduce), so the tiny fp32 models' greedy tokens must match.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ARCHS, _config, build_tokenizer
from test_parallel import rows_done, shard_rows, wait_until, write_prompts

from bulkgen import LLM, SamplingParams
from bulkgen.model.attention import get_backend
from bulkgen.model.config import ModelConfig
from bulkgen.model.loader import load_model
from bulkgen.model.parallel_layers import TensorParallel, WeightShard, check_shape

REPO = Path(__file__).resolve().parent.parent
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13], list(range(20, 60)), [3] * 70]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def greedy_tokens(model_dir: Path, **kwargs) -> list[list[int]]:
    llm = LLM(str(model_dir), dtype="float32", device="cpu", block_size=16, **kwargs)
    try:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.close()


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory) -> Path:
    """A Llama with one KV head (so 2 ranks share it) and an odd vocabulary (383 rows: the second
    rank's half of the embedding and lm_head has a padding row)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("mqa")
    tokenizer = build_tokenizer(out)
    config = _config("llama", 383, tokenizer.eos_token_id)
    config.num_key_value_heads = 1
    torch.manual_seed(99)
    AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32).save_pretrained(out)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_two_ranks_give_the_greedy_tokens_of_one_process(tiny_models, arch):
    assert greedy_tokens(tiny_models[arch], tensor_parallel=2) == greedy_tokens(tiny_models[arch])


def test_two_ranks_sharing_one_kv_head_give_the_tokens_of_one_process(one_kv_head_model):
    assert ModelConfig.from_dir(one_kv_head_model).num_kv_heads == 1
    one = greedy_tokens(one_kv_head_model)
    assert greedy_tokens(one_kv_head_model, tensor_parallel=2) == one


def test_sampling_penalties_logprobs_and_grammars_work_on_the_gathered_logits(tiny_model_dir):
    # Rank 0 samples from the logits gathered from both ranks: every sampling feature sees the
    # whole vocabulary, and a constrained step's late sampling (after its masks) stays in step.
    params = [
        SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, logprobs=3),
        SamplingParams(max_tokens=10, temperature=0.0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.0, choice=["yes", "no", "maybe"]),
        SamplingParams(max_tokens=10, temperature=1.0, top_k=20, seed=3, presence_penalty=0.5),
    ]

    def run(**kwargs):
        llm = LLM(str(tiny_model_dir), dtype="float32", device="cpu", **kwargs)
        try:
            return llm.generate(PROMPTS, params)
        finally:
            llm.close()

    one, two = run(), run(tensor_parallel=2)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert two[2].text in ("yes", "no", "maybe")
    assert two[0].logprobs == pytest.approx(one[0].logprobs, abs=1e-4)


def test_each_of_two_ranks_loads_half_the_weights(tiny_model_dir):
    cfg = ModelConfig.from_dir(tiny_model_dir)
    cpu = torch.device("cpu")
    backend = get_backend("torch", cpu)

    def load(tp: TensorParallel):
        return load_model(tiny_model_dir, cfg, backend, torch.float32, cpu, tp=tp)

    whole = load(TensorParallel())
    ranks = [load(TensorParallel(r, 2)) for r in range(2)]
    replicated = sum(p.numel() * 4 for n, p in whole.named_parameters() if "norm" in n)
    for model in ranks:
        # Only the norms are read whole; every projection and the vocabulary are halved.
        assert model.loaded_bytes == (whole.loaded_bytes - replicated) // 2 + replicated
        assert model.loaded_bytes < 0.51 * whole.loaded_bytes
        params = sum(p.numel() for p in model.parameters())
        assert params < 0.51 * sum(p.numel() for p in whole.parameters())
    # And the halves are the halves: rank 1 holds the second half of the query heads.
    q = cfg.q_size
    full_q = whole.model.layers[0].self_attn.qkv_proj.weight[:q]
    rank1_q = ranks[1].model.layers[0].self_attn.qkv_proj.weight[: q // 2]
    assert torch.equal(rank1_q, full_q[q // 2 :])


def test_kv_heads_shared_by_ranks_are_the_ones_their_query_heads_read():
    cfg = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 10,
            "hidden_size": 64,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
        }  # fmt: skip
    )
    # 4 ranks, 2 query heads each; query heads 0-3 read KV head 0, 4-7 KV head 1.
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    starts = [WeightShard(cfg, r, 4).slice_of(k_proj)[1] for r in range(4)]
    assert starts == [0, 0, 8, 8]
    with pytest.raises(ValueError, match="attention heads"):
        check_shape(cfg, 3)


def run_cli(args: list, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **kwargs.pop("env", {})}
    cmd = [sys.executable, "-m", "bulkgen.cli", "run", *map(str, args)]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, **kwargs)


def rank_pids(parent: int) -> list[int]:
    """The tensor-parallel rank processes among parent's children."""
    out = subprocess.run(["ps", "-o", "pid=,ppid=,args=", "-e"], capture_output=True, text=True)
    pids = []
    for line in out.stdout.splitlines():
        pid, ppid, args = line.split(None, 2)
        if int(ppid) == parent and "bulkgen.engine.tp_worker" in args:
            pids.append(int(pid))
    return pids


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_rank_fails_the_job_in_one_line_and_the_rerun_completes(tmp_path, tiny_model_dir):
    prompts = write_prompts(tmp_path / "in.jsonl", 60)
    out = tmp_path / "out"
    args = [prompts, "-m", tiny_model_dir, "--device", "cpu", "-o", out, "--tp", "2",
            "--max-tokens", "64", "--shard-size", "5", "--max-num-seqs", "4", "-q"]  # fmt: skip
    job = run_cli(args)
    wait_until(lambda: rows_done(out) >= 5, timeout=120)
    assert rows_done(out) >= 5, "no shard written"
    (worker,) = rank_pids(job.pid)
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    _, err = job.communicate(timeout=60)
    assert job.returncode == 1
    assert time.monotonic() - killed < 10
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: tensor-parallel rank 1") and "SIGKILL" in lines[0]
    assert not alive(worker) and not rank_pids(job.pid)
    assert rows_done(out) < 60  # it stopped part-way

    rerun = run_cli(args)
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    ids = [r["id"] for r in shard_rows(out)]
    assert sorted(ids) == sorted(f"in:{i}" for i in range(60))  # each row exactly once


def test_two_data_parallel_groups_of_two_ranks_write_every_row_once(tmp_path, tiny_model_dir):
    prompts = write_prompts(tmp_path / "in.jsonl", 16)
    out = tmp_path / "out"
    common = [prompts, "-m", tiny_model_dir, "--device", "cpu", "--max-tokens", "8", "-q",
              "--shard-size", "4"]  # fmt: skip
    job = run_cli([*common, "-o", out, "--data-parallel", "2", "--tensor-parallel", "2"])
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err
    ids = [r["id"] for r in shard_rows(out)]
    assert sorted(ids) == sorted(f"in:{i}" for i in range(16))
    single = tmp_path / "single"
    job = run_cli([*common, "-o", single])
    assert job.wait(timeout=600) == 0
    texts = {r["id"]: r["text"] for r in shard_rows(single)}
    assert all(r["text"] == texts[r["id"]] for r in shard_rows(out))


def test_a_split_the_model_cannot_take_is_one_error_line(tmp_path, tiny_model_dir):
    from click.testing import CliRunner

    from bulkgen.cli import main

    prompts = write_prompts(tmp_path / "in.jsonl", 2)
    args = ["run", str(prompts), "-m", str(tiny_model_dir), "--device", "cpu", "-q",
            "-o", str(tmp_path / "out"), "--tp", "3"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "--tensor-parallel 3 does not divide the model's 4 attention heads" in result.output
    assert not list((tmp_path / "out").glob("part-*"))


def test_the_other_ranks_end_when_rank_0_is_killed(tmp_path, tiny_model_dir):
    prompts = write_prompts(tmp_path / "in.jsonl", 200)
    out = tmp_path / "out"
    job = run_cli([prompts, "-m", tiny_model_dir, "--device", "cpu", "-o", out, "--tp", "2", "-q",
                   "--max-tokens", "64", "--max-num-seqs", "2", "--shard-size", "1"])  # fmt: skip
    wait_until(lambda: rows_done(out) >= 1 or job.poll() is not None, timeout=120)
    ranks = rank_pids(job.pid)
    assert len(ranks) == 1 and job.poll() is None
    job.kill()
    job.wait()
    wait_until(lambda: not any(alive(pid) for pid in ranks), timeout=5)
    assert not any(alive(pid) for pid in ranks)


def test_a_rank_ends_when_rank_0_is_killed_while_the_rank_starts(tmp_path, tiny_model_dir):
    """Found by fuzzing: a rank took its parent's pid only after its imports (about a second), so
    a rank 0 killed before then left it init's child, watching init, and alive in its rendezvous
    until BULKGEN_TP_TIMEOUT_S (600 s). Rank 0 now passes its pid."""
    prompts = write_prompts(tmp_path / "in.jsonl", 4)
    job = run_cli([prompts, "-m", tiny_model_dir, "--device", "cpu", "-o", tmp_path / "out",
                   "--tp", "2", "-q"])  # fmt: skip
    ranks = []
    deadline = time.monotonic() + 120
    while not ranks and job.poll() is None and time.monotonic() < deadline:
        ranks = rank_pids(job.pid)
    job.kill()  # within a few ms of the rank's start: it is still importing torch
    job.wait()
    try:
        assert len(ranks) == 1, "rank 1 was not seen"
        spec = Path(Path(f"/proc/{ranks[0]}/cmdline").read_bytes().split(b"\0")[-3].decode())
        wait_until(lambda: not any(alive(pid) for pid in ranks), timeout=5)
        assert not any(alive(pid) for pid in ranks)
        # The group's folder (specs, logs, rendezvous) goes with the rank: rank 0 could not.
        assert spec.parent.name.startswith("bulkgen-tp-") and not spec.parent.exists()
    finally:
        for pid in filter(alive, ranks):
            os.kill(pid, signal.SIGKILL)
