"""Device-resident per-request tables, one row per running request (Request.table_row).

- block_table [rows, max_blocks_per_seq] int32: each request's KV block ids, updated by appends
  (only the ids a request gained since its last step travel with the step's inputs), as vLLM V1's
  BlockTable or SGLang's req_to_token. A step's tables are a gather of its rows, always of the
  full width, so kernel launches never change with the longest context.
- last_token [rows] int64: each request's latest sampled id, written right after sampling, so
  the next decode step takes its input token on the device without waiting for the host.
- partners [num_blocks + 1] int32 (pair_first only): each block's first-block partner or -1
  (model/attention/kv_pairs.py), updated by the step's partner changes (Plan.partners), which
  travel among the block-table appends as rows of -1 (row -1, column block, the partner). The
  last entry, and a last row of block_table, take the other kind's writes: no masked scatter,
  so no wait for the device.

Rows are written on the compute stream only: a row the scheduler frees and hands to another
request is rewritten after every launched step that read it, in stream order.
"""

from __future__ import annotations

import torch

from bulkgen.engine.inputs import StepInputs


class DeviceTables:
    def __init__(
        self, rows: int, max_blocks_per_seq: int, device: torch.device, pair_blocks: int = 0
    ) -> None:
        """pair_blocks: the cache's block count when first blocks have partners (else 0)."""
        self.rows = rows
        table_rows = rows + (1 if pair_blocks else 0)
        self.block_table = torch.zeros(
            table_rows, max_blocks_per_seq, dtype=torch.int32, device=device
        )
        self.last_token = torch.zeros(rows, dtype=torch.int64, device=device)
        self.partners = None
        if pair_blocks:
            self.partners = torch.full((pair_blocks + 1,), -1, dtype=torch.int32, device=device)

    def apply_updates(self, inp: StepInputs) -> None:
        if inp.update_rows.numel():
            rows, cols = inp.update_rows, inp.update_cols
            blocks = inp.update_blocks.to(torch.int32)
            if self.partners is not None:
                partner = rows < 0
                self.partners[torch.where(partner, cols, self.partners.shape[0] - 1)] = blocks
                rows, cols = torch.where(partner, self.rows, rows), torch.where(partner, 0, cols)
            self.block_table[rows, cols] = blocks

    def block_tables(self, inp: StepInputs) -> torch.Tensor:
        """[B, max_blocks_per_seq] int32 block tables of the step's sequences."""
        return self.block_table.index_select(0, inp.rows)

    def input_ids(self, inp: StepInputs, any_from_prev: bool) -> torch.Tensor:
        """Decode inputs whose token is the previous step's sample are taken on the device."""
        if not any_from_prev:
            return inp.input_ids
        prev = self.last_token[inp.prev_row.clamp(min=0)]
        return torch.where(inp.prev_row >= 0, prev, inp.input_ids)

    def record(self, inp: StepInputs, ids: torch.Tensor) -> None:
        self.last_token.index_copy_(0, inp.sample_rows, ids)
