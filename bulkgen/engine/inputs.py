"""Step inputs: a Plan packed into one pinned host buffer and copied to the device in one go.

Per-step host work is kept flat per row: block tables live on the device (BlockTable) and only
the block ids a request gained since its last step travel; decode rows cost a few list appends,
prefill chunks one numpy expression. Two host buffers alternate between steps so that preparing
step N+1 never overwrites the bytes step N's copy may still be reading; each buffer's copy event
guards its reuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch

from bulkgen.config import SamplingParams
from bulkgen.engine.plan import Plan
from bulkgen.engine.request import Request
from bulkgen.engine.sampler import float_logits

# Float fields per sampled row, in packing order.
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition", "presence", "frequency")


@dataclass
class StepInputs:
    """Device tensors of one step (views into one packed copy)."""

    input_ids: torch.Tensor  # [T] host-known ids (0 where the token comes from the prev step)
    prev_row: torch.Tensor  # [T] table row whose last sampled token is the input, or -1
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T]
    query_start_loc: torch.Tensor  # [B + 1] int64 (cast where used: graph steps never need it)
    seq_lens: torch.Tensor  # [B] int64
    rows: torch.Tensor  # [B] table row of each sequence
    logits_indices: torch.Tensor  # [S] rows of the step's tokens whose next token is sampled
    seeds: torch.Tensor  # [S]
    top_k: torch.Tensor  # [S]
    sample_positions: torch.Tensor  # [S] position of each sampled token
    sample_rows: torch.Tensor  # [S] table row of each sampled sequence
    update_rows: torch.Tensor  # [U] block-table appends: row, column, block id
    update_cols: torch.Tensor
    update_blocks: torch.Tensor
    temperature: torch.Tensor  # [S] float32
    top_p: torch.Tensor  # [S] float32
    min_p: torch.Tensor  # [S] float32
    repetition: torch.Tensor  # [S] float32 penalties (1, 0, 0 = off)
    presence: torch.Tensor
    frequency: torch.Tensor


@dataclass
class PackedStep:
    """The packed device copy of a step's inputs; `ready` fires when the copy has landed."""

    ints: torch.Tensor
    floats: torch.Tensor
    ready: torch.cuda.Event | None
    sizes: tuple[int, int, int, int]  # T, B, S, U
    turn: int  # which of the two buffers it occupies
    query_lens: list[int]  # host copies for the attention metadata
    seq_lens: list[int]
    fresh_penalized: list[Request]  # penalised requests in their first step since (re)admission
    host: tuple[np.ndarray, np.ndarray] | None = None  # the packed ints and floats (host copies)
    # The distinct sampling parameters of the rows that sample (the sampler's choices of path
    # read these, not every row), and whether any input token is the previous step's sample.
    sampled_params: list[SamplingParams] = field(default_factory=list)
    from_prev: bool = False

    def float_logits(self, batch_invariant: bool) -> bool:
        """Whether the step's logits are widened to float32 (sampler.float_logits)."""
        return float_logits(self.sampled_params, batch_invariant)

    def unpack(self) -> StepInputs:
        """Views, no kernels; call on the compute stream after it waited for `ready`."""
        T, B, S, U = self.sizes
        lengths = [T, T, T, T, B + 1, B, B, S, S, S, S, S, U, U, U]
        fields = self.ints.split([_pad(n, 2) for n in lengths])
        (ids, prev, pos, slot, qsl, sl, rows, li, sd, tk, sp, sr, ur, uc, ub) = (
            f[:n] for f, n in zip(fields, lengths, strict=True)
        )
        f_fields = self.floats.split([_pad(S, 4)] * len(FLOAT_FIELDS))
        floats = {name: f[:S] for name, f in zip(FLOAT_FIELDS, f_fields, strict=True)}
        return StepInputs(
            input_ids=ids,
            prev_row=prev,
            positions=pos,
            slot_mapping=slot,
            query_start_loc=qsl,
            seq_lens=sl,
            rows=rows,
            logits_indices=li,
            seeds=sd,
            top_k=tk,
            sample_positions=sp,
            sample_rows=sr,
            update_rows=ur,
            update_cols=uc,
            update_blocks=ub,
            **floats,
        )


def _pad(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _padded_rows(fields: np.ndarray, multiple: int) -> np.ndarray:
    """Fields [k, n] flattened with each padded to a multiple of `multiple` elements (16 bytes),
    so every field's device view starts 16-byte aligned whatever the step's sizes: Triton
    specialises kernels on pointer alignment and would otherwise compile variants mid-run."""
    k, n = fields.shape
    out = np.zeros((k, _pad(n, multiple)), fields.dtype)
    out[:, :n] = fields
    return out.reshape(-1)


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
        # Table appends: at most every block of every row (a prefix-cache hit syncs many), and
        # partner changes (tables.py). Every field padded to 16 bytes (_pad), plus 1 per field.
        appends = max_seqs * max_blocks_per_seq + 2 * (max_tokens // block_size + 2 * max_seqs)
        self.int_cap = 4 * max_tokens + 8 * max_seqs + 3 * appends + 16
        self.float_cap = len(FLOAT_FIELDS) * (max_seqs + 3)
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

    def pack(self, plan: Plan, stream) -> PackedStep:
        seqs = plan.seqs
        bs = self.block_size
        ids: list[int] = []
        prev: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        rows: list[int] = []
        ends: list[int] = []
        updates: list[tuple[int, int, int]] = []  # (row, column, block id)
        samples: list[tuple[int, int, int, int, int]] = []  # token, seed, top_k, position, row
        floats: list[tuple[float, ...]] = []
        fresh = []
        distinct: dict[int, SamplingParams] = {}  # the sampled rows' parameters, by identity
        last_params = None
        from_prev = False
        # The per-row work of every step: bound methods and locals (decode rows are most rows).
        add_position, add_slot, add_id, add_prev = (
            positions.append,
            slots.append,
            ids.append,
            prev.append,
        )
        add_row, add_end = rows.append, ends.append
        for s in seqs:
            req, start, n = s.request, s.start, s.num_tokens
            blocks, row = req.block_ids, req.table_row
            end = start + n
            if n == 1:  # decode rows: the common case, kept to a few appends
                add_position(start)
                add_slot(blocks[start // bs] * bs + start % bs)
                if s.from_prev:
                    from_prev = True
                    add_id(0)
                    add_prev(row)
                else:
                    add_id(req.token_at(start))
                    add_prev(-1)
            else:
                span = np.arange(start, end)
                positions.extend(span.tolist())
                table = np.asarray(blocks[start // bs : -(-end // bs)])
                slots.extend((table[span // bs - start // bs] * bs + span % bs).tolist())
                ids.extend(req.token_slice(start, end))
                prev.extend([-1] * n)
            synced = req.num_synced_blocks
            if synced < len(blocks):
                if synced == 0 and req.params.penalized:
                    fresh.append(req)
                updates.extend((row, c, blocks[c]) for c in range(synced, len(blocks)))
                req.num_synced_blocks = len(blocks)
            add_row(row)
            add_end(end)
            if s.sample:
                p = req.params
                if p is not last_params:  # rows mostly share one SamplingParams
                    distinct[id(p)] = last_params = p
                samples.append((len(positions) - 1, req.seed, max(p.top_k, 0), end, row))
                floats.append(p.sampling_floats)
        # First-block partner changes ride with the appends as rows of -1 (tables.py).
        updates.extend((-1, block, partner) for block, partner in plan.partners.items())
        T, B, S, U = len(positions), len(seqs), len(samples), len(updates)
        qsl = np.zeros(B + 1, np.int64)
        starts = np.fromiter((s.start for s in seqs), np.int64, B)
        np.cumsum(np.asarray(ends, np.int64) - starts, out=qsl[1:])
        per_token = np.asarray([ids, prev, positions, slots], np.int64).reshape(4, T)
        # fromiter over the flattened tuples: about 1.6x asarray's speed on a list of tuples.
        per_sample = np.fromiter(chain.from_iterable(samples), np.int64, 5 * S).reshape(S, 5).T
        per_update = np.asarray(updates, np.int64).reshape(U, 3).T
        ints = np.concatenate(
            [
                _padded_rows(per_token, 2),
                _padded_rows(qsl[None], 2),
                _padded_rows(np.asarray([ends, rows], np.int64).reshape(2, B), 2),
                _padded_rows(per_sample, 2),
                _padded_rows(per_update, 2),
            ]
        )
        nf = len(FLOAT_FIELDS)
        per_field = np.fromiter(chain.from_iterable(floats), np.float32, nf * S).reshape(S, nf).T
        flat = _padded_rows(per_field, 4)
        turn = self.turn
        dev_ints, dev_floats, ready = self._copy(ints, flat, stream)
        q_lens = np.diff(qsl).tolist()
        sizes, host = (T, B, S, U), (ints, flat)
        return PackedStep(
            dev_ints,
            dev_floats,
            ready,
            sizes,
            turn,
            q_lens,
            ends,
            fresh,
            host,
            list(distinct.values()),
            from_prev,
        )

    def load(
        self,
        ints: np.ndarray,
        floats: np.ndarray,
        sizes: tuple[int, int, int, int],
        query_lens: list[int],
        seq_lens: list[int],
        from_prev: bool,
        stream,
    ) -> PackedStep:
        """A step another process packed (a tensor-parallel rank's copy of rank 0's step)."""
        turn = self.turn
        dev_ints, dev_floats, ready = self._copy(ints, floats, stream)
        return PackedStep(
            dev_ints, dev_floats, ready, sizes, turn, query_lens, seq_lens, [], from_prev=from_prev
        )

    def _copy(self, ints: np.ndarray, floats: np.ndarray, stream):
        i = self.turn
        self.turn ^= 1
        if self.copied[i] is not None:
            # This buffer's copy belongs to step N-2, whose done event the engine has already
            # waited for (it launches N, then waits for N-1), so the copy is complete and this
            # never waits in the step loop; the check guards callers that launch without waiting.
            if not self.copied[i].query():
                self.copied[i].synchronize()
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
