"""Block manager: fixed-size KV-cache blocks with reference counts and a free list."""

from __future__ import annotations

from collections import deque


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, count: int) -> list[int]:
        if count > len(self.free_ids):
            raise RuntimeError(f"asked for {count} KV blocks with {len(self.free_ids)} free")
        ids = [self.free_ids.popleft() for _ in range(count)]
        for i in ids:
            self.ref_counts[i] = 1
        return ids

    def free(self, block_ids: list[int]) -> None:
        for i in block_ids:
            self.ref_counts[i] -= 1
            assert self.ref_counts[i] >= 0, f"block {i} freed twice"
            if self.ref_counts[i] == 0:
                self.free_ids.append(i)
