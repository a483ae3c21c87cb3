"""Step inputs: a Plan packed into one pinned host buffer and copied to the device in one go.

Two host buffers alternate between steps so that preparing step N+1 never overwrites the bytes
step N's copy may still be reading; each buffer's copy event guards its reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bulkgen.engine.scheduler import Plan


@dataclass
class StepInputs:
    """Device tensors of one step (views into one packed copy)."""

    input_ids: torch.Tensor  # [T] host-known ids (0 where the token comes from the prev step)
    prev_index: torch.Tensor  # [T] row of the previous step's samples to take, or -1
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T]
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, W] int32
    logits_indices: torch.Tensor  # [S] rows of the step's tokens whose next token is sampled
    seeds: torch.Tensor  # [S]
    top_k: torch.Tensor  # [S]
    sample_positions: torch.Tensor  # [S] position of each sampled token
    temperature: torch.Tensor  # [S] float32
    top_p: torch.Tensor  # [S] float32
    min_p: torch.Tensor  # [S] float32


@dataclass
class PackedStep:
    """The packed device copy of a step's inputs; `ready` fires when the copy has landed."""

    ints: torch.Tensor
    floats: torch.Tensor
    ready: torch.cuda.Event | None
    sizes: tuple[int, int, int, int]  # T, B, S, W
    turn: int  # which of the two buffers it occupies

    def unpack(self) -> StepInputs:
        """Views and dtype casts; call on the compute stream after it waited for `ready`."""
        T, B, S, W = self.sizes
        split = [T, T, T, T, B + 1, B, B * W, S, S, S, S]
        (ids, prev, pos, slot, qsl, sl, bt, li, sd, tk, sp) = self.ints.split(split)
        f = self.floats
        return StepInputs(
            input_ids=ids,
            prev_index=prev,
            positions=pos,
            slot_mapping=slot,
            query_start_loc=qsl.int(),
            seq_lens=sl.int(),
            block_tables=bt.view(B, W).int(),
            logits_indices=li,
            seeds=sd,
            top_k=tk,
            sample_positions=sp,
            temperature=f[:S],
            top_p=f[S : 2 * S],
            min_p=f[2 * S :],
        )


class InputPacker:
    """Builds StepInputs from a Plan with one int64 and one float32 host-to-device copy."""

    def __init__(
        self,
        device: torch.device,
        block_size: int,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
    ) -> None:
        self.device = device
        self.block_size = block_size
        self.pin = device.type == "cuda"
        self.int_cap = 5 * max_tokens + 6 * max_seqs + 1 + max_seqs * max_blocks_per_seq
        self.float_cap = 3 * max_seqs
        self.ints = [self._host(self.int_cap, torch.int64) for _ in range(2)]
        self.floats = [self._host(self.float_cap, torch.float32) for _ in range(2)]
        self.copied = [None, None]  # per host buffer: event of the last copy out of it
        # Device buffers are allocated once: allocating per step on the copy stream would make
        # the caching allocator hold blocks behind events of the other stream.
        self.dev_ints = [self._device(self.int_cap, torch.int64) for _ in range(2)]
        self.dev_floats = [self._device(self.float_cap, torch.float32) for _ in range(2)]
        self.consumed: list = [None, None]  # per device buffer: event after its last reader
        self.turn = 0

    def _host(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(n, dtype=dtype, pin_memory=self.pin)

    def _device(self, n: int, dtype: torch.dtype) -> torch.Tensor | None:
        return torch.empty(n, dtype=dtype, device=self.device) if self.pin else None

    def release(self, packed: PackedStep, event: torch.cuda.Event | None) -> None:
        """The step that read `packed` is enqueued; `event` fires once it is done with it."""
        self.consumed[packed.turn] = event

    def pack(self, plan: Plan, prev_rows: dict[int, int], stream) -> PackedStep:
        """prev_rows maps id(request) -> its row in the previous step's samples."""
        seqs, sampled = plan.seqs, plan.sampled
        T, B, S = plan.num_tokens, len(seqs), len(sampled)
        W = max(len(s.request.block_ids) for s in seqs)
        bs = self.block_size
        input_ids = np.zeros(T, np.int64)
        prev_index = np.full(T, -1, np.int64)
        positions = np.empty(T, np.int64)
        slots = np.empty(T, np.int64)
        qsl = np.zeros(B + 1, np.int64)
        seq_lens = np.empty(B, np.int64)
        tables = np.zeros((B, W), np.int64)
        logits_idx, seeds, top_k, sample_pos = [], [], [], []
        temp, top_p, min_p = [], [], []
        t = 0
        for b, s in enumerate(seqs):
            req, n = s.request, s.num_tokens
            pos = np.arange(s.start, s.end)
            positions[t : t + n] = pos
            blocks = np.asarray(req.block_ids, np.int64)
            slots[t : t + n] = blocks[pos // bs] * bs + pos % bs
            if s.from_prev:
                prev_index[t] = prev_rows[id(req)]
            else:
                input_ids[t : t + n] = req.all_token_ids[s.start : s.end]
            tables[b, : len(blocks)] = blocks
            t += n
            qsl[b + 1] = t
            seq_lens[b] = s.end
            if s.sample:
                p = req.params
                logits_idx.append(t - 1)
                seeds.append(req.seed)
                top_k.append(p.top_k if p.top_k > 0 else 0)
                sample_pos.append(s.end)
                temp.append(0.0 if p.greedy else p.temperature)  # top_k=1 is greedy too
                top_p.append(p.top_p)
                min_p.append(p.min_p)
        ints = np.concatenate(
            [
                input_ids,
                prev_index,
                positions,
                slots,
                qsl,
                seq_lens,
                tables.reshape(-1),
                np.asarray(logits_idx + seeds + top_k + sample_pos, np.int64),
            ]
        )
        floats = np.asarray(temp + top_p + min_p, np.float32)
        turn = self.turn
        dev_ints, dev_floats, ready = self._copy(ints, floats, stream)
        return PackedStep(dev_ints, dev_floats, ready, (T, B, S, W), turn)

    def _copy(self, ints: np.ndarray, floats: np.ndarray, stream):
        i = self.turn
        self.turn ^= 1
        if self.copied[i] is not None:
            self.copied[i].synchronize()  # the copy two steps ago has long finished; cheap
        host_i = self.ints[i][: len(ints)]
        host_f = self.floats[i][: len(floats)]
        host_i.numpy()[:] = ints
        host_f.numpy()[:] = floats
        if self.device.type != "cuda":
            return host_i.clone(), host_f.clone(), None
        with torch.cuda.stream(stream):
            if self.consumed[i] is not None:
                stream.wait_event(self.consumed[i])  # on the device: step N-2 is done reading
            dev_i = self.dev_ints[i][: len(ints)]
            dev_f = self.dev_floats[i][: len(floats)]
            dev_i.copy_(host_i, non_blocking=True)
            dev_f.copy_(host_f, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        self.copied[i] = event
        return dev_i, dev_f, event
