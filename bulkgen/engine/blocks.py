"""Block manager: fixed-size KV-cache blocks, reference counts, and a prefix cache.

A full block is known by a chained hash of its tokens and every token before it, so equal hashes
mean equal KV. Blocks whose last user is gone keep their contents and their hash and sit in the
free list, least recently freed first; a request whose prompt starts with the same tokens takes
them back instead of recomputing them. Allocation uses blocks holding nothing cached first, then
evicts the least recently freed cached ones.
"""

from __future__ import annotations

from collections import OrderedDict


def chain_hash(prev: int | None, tokens: tuple[int, ...]) -> int:
    return hash((prev, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool = False) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.ref_counts = [0] * num_blocks
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Per block: (chain hash, previous hash, tokens) while it holds a cached full block.
        self.block_key: list[tuple[int, int | None, tuple[int, ...]] | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # chain hash -> block id

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, count: int) -> list[int]:
        if count > len(self.free_ids):
            raise RuntimeError(f"asked for {count} KV blocks with {len(self.free_ids)} free")
        ids = []
        for _ in range(count):
            block, _ = self.free_ids.popitem(last=False)
            self._forget(block)
            self.ref_counts[block] = 1
            ids.append(block)
        return ids

    def free(self, block_ids: list[int]) -> None:
        for i in block_ids:
            self.ref_counts[i] -= 1
            assert self.ref_counts[i] >= 0, f"block {i} freed twice"
            if self.ref_counts[i] == 0:
                self.free_ids[i] = None
                if self.block_key[i] is None:
                    self.free_ids.move_to_end(i, last=False)  # nothing to keep: reuse it first

    # ---- prefix cache ----------------------------------------------------------------------

    def _forget(self, block: int) -> None:
        key = self.block_key[block]
        if key is not None:
            if self.cached.get(key[0]) == block:
                del self.cached[key[0]]
            self.block_key[block] = None

    def hash_of(self, block: int) -> int:
        return self.block_key[block][0]

    def lookup(self, token_ids: list[int], max_blocks: int) -> list[int]:
        """Cached blocks holding the longest prefix of token_ids (at most max_blocks); taken."""
        if not self.prefix_cache:
            return []
        bs, prev, hits = self.block_size, None, []
        for i in range(max_blocks):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(prev, tokens)
            block = self.cached.get(h)
            # Compare the tokens and the chain too: a hash collision must never reuse wrong KV.
            if block is None or self.block_key[block] != (h, prev, tokens):
                break
            hits.append(block)
            prev = h
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_ids[block]
            self.ref_counts[block] += 1
        return hits

    def register(self, block: int, prev: int | None, tokens: tuple[int, ...]) -> int:
        """Record that `block` holds the KV of `tokens` after the chain `prev`; returns its hash."""
        h = chain_hash(prev, tokens)
        if self.prefix_cache and self.block_key[block] is None and h not in self.cached:
            self.block_key[block] = (h, prev, tokens)
            self.cached[h] = block
        return h
