"""Block manager: fixed-size KV-cache blocks, reference counts, and a prefix cache.

A full block is known by a digest of its tokens and every token before it: a cryptographic hash
(blake2b, 128 bits) of the parent block's digest and the block's own tokens, so that nobody can
craft two prompts whose blocks share a key (Python's unkeyed tuple hash allowed that; vLLM moved
to sha256 for the same reason, CVE-2025-25183). The digest only finds a candidate: a cached block
is reused only when its tokens and its parent block (that very allocation of it) are equal too,
so even a digest collision can never serve KV computed after a different prefix.

Blocks whose last user is gone keep their contents and their key and sit in the free list, least
recently freed first; a request whose prompt starts with the same tokens takes them back instead
of recomputing them. Allocation uses blocks holding nothing cached first, then evicts the least
recently freed cached ones.

Paired first blocks (pair_first: an fp8 cache's first block kept at about 16-bit precision,
attention/kv_pairs.py): a sequence's first block gets a partner block, which holds the low part
of its keys and values. The partner belongs to the block, not to the request: requests that share
the block through the prefix cache share it, a cached block keeps it while it waits in the free
list, and it goes back to the free list when its block is freed uncached or evicted. A sequence
then costs one block more than its table holds (cost, held). `partner` is every block's partner
(-1: none); take_partner_changes() gives what changed since its last call, for the device copy.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from typing import NamedTuple

log = logging.getLogger(__name__)


def block_digest(parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
    """The 16-byte key of a full block: blake2b over the parent's digest and the token ids."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", tokens).tobytes())
    return h.digest()


class ChainKey(NamedTuple):
    """Where a chain of full blocks stands: the digest of all its tokens, and the block holding
    their KV (the cached one when there is one) with the allocation it was written in."""

    digest: bytes
    block: int
    serial: int


# What a cached block holds: its digest, its parent (block, serial) or None, and its tokens.
_Entry = tuple[bytes, tuple[int, int] | None, tuple[int, ...]]


def _parent(prev: ChainKey | None) -> tuple[int, int] | None:
    return None if prev is None else (prev.block, prev.serial)


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, prefix_cache: bool = False, pair_first: bool = False
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.pair_first = pair_first
        self.partner = [-1] * num_blocks
        self._partner_changes: dict[int, int] = {}
        self._idle_partners = 0  # partners of cached blocks in the free list: free on eviction
        self.ref_counts = [0] * num_blocks
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Per block: which allocation it is in. A child's entry names its parent's (block,
        # serial), so a parent evicted and rewritten can never be mistaken for the old one.
        self.serial = [0] * num_blocks
        self._next_serial = 1
        self.block_key: list[_Entry | None] = [None] * num_blocks  # while it is cached
        self.cached: dict[bytes, int] = {}  # digest -> block id

    @classmethod
    def for_engine(cls, num_blocks: int, cfg) -> BlockManager:
        """The engine's: cfg an EngineConfig with its settings resolved."""
        return cls(num_blocks, cfg.block_size, cfg.prefix_cache, cfg.fp8_kv_pair_first_block)

    @property
    def num_free(self) -> int:
        return len(self.free_ids) + self._idle_partners

    def blocks_for(self, num_tokens: int) -> int:
        """Table blocks of a sequence of num_tokens."""
        return -(-num_tokens // self.block_size)

    def cost(self, num_tokens: int) -> int:
        """Blocks a sequence of num_tokens takes: its table's and its first block's partner."""
        return self.blocks_for(num_tokens) + (self.pair_first and num_tokens > 0)

    def context_that_fits(self, max_model_len: int) -> int:
        """max_model_len, or the most tokens one sequence can hold in the whole cache where that
        is less (a cache sized by hand, num_blocks): a sequence ends there with finish_reason
        "length", as at the model's context, never cut short by preempting itself."""
        tokens = self.num_blocks * self.block_size
        while tokens > 0 and self.cost(tokens) > self.num_blocks:
            tokens -= self.block_size
        if tokens >= max_model_len:
            return max_model_len
        log.warning(
            "the KV cache holds %d tokens, less than the context of %d: a sequence ends at %d",
            tokens, max_model_len, tokens,
        )  # fmt: skip
        return tokens

    def held(self, block_ids: list[int]) -> int:
        """Blocks a sequence with this table holds (its first block's partner counted, shared
        or not)."""
        return len(block_ids) + (self.pair_first and bool(block_ids))

    def allocate(self, count: int, first: bool = False) -> list[int]:
        """count blocks; first (a sequence's first allocation, with pair_first): the last of
        them becomes the first one's partner and is not returned."""
        if count > self.num_free:
            raise RuntimeError(f"asked for {count} KV blocks with {self.num_free} free")
        ids = []
        for _ in range(count):
            block, _ = self.free_ids.popitem(last=False)
            self._forget(block)
            if self.partner[block] >= 0:  # an evicted first block's partner comes free
                self._idle_partners -= 1
                self._drop_partner(block)
            self.ref_counts[block] = 1
            self.serial[block] = self._next_serial
            self._next_serial += 1
            ids.append(block)
        if first and self.pair_first and len(ids) > 1:
            partner = ids.pop()
            self.partner[ids[0]] = partner
            self._partner_changes[ids[0]] = partner
        return ids

    def free(self, block_ids: list[int]) -> None:
        for i in block_ids:
            self.ref_counts[i] -= 1
            assert self.ref_counts[i] >= 0, f"block {i} freed twice"
            if self.ref_counts[i] == 0:
                self.free_ids[i] = None
                if self.block_key[i] is None:
                    self._drop_partner(i)
                    self.free_ids.move_to_end(i, last=False)  # nothing to keep: reuse it first
                elif self.partner[i] >= 0:
                    self._idle_partners += 1

    def _drop_partner(self, block: int) -> None:
        partner = self.partner[block]
        if partner >= 0:
            self.partner[block] = -1
            self._partner_changes[block] = -1
            self.ref_counts[partner] = 0
            self.free_ids[partner] = None
            self.free_ids.move_to_end(partner, last=False)

    def take_partner_changes(self) -> dict[int, int]:
        """{block: its partner now (-1: none)} for every block whose partner changed since the
        last call."""
        changes, self._partner_changes = self._partner_changes, {}
        return changes

    # ---- prefix cache ----------------------------------------------------------------------

    def _forget(self, block: int) -> None:
        key = self.block_key[block]
        if key is not None:
            if self.cached.get(key[0]) == block:
                del self.cached[key[0]]
            self.block_key[block] = None

    def forget_free(self) -> None:
        """Drop every free block from the prefix cache: after a step that raised (Ctrl-C in
        LLM.generate), blocks registered at plan time may never have had their KV written."""
        for block in range(self.num_blocks):
            if self.ref_counts[block] == 0 and self.block_key[block] is not None:
                self._forget(block)
                if self.partner[block] >= 0:
                    self._idle_partners -= 1
                    self._drop_partner(block)
                self.free_ids.move_to_end(block, last=False)  # nothing to keep: reuse it first

    def key_of(self, block: int) -> ChainKey:
        """The chain key of a cached block (as lookup() returned it)."""
        return ChainKey(self.block_key[block][0], block, self.serial[block])

    def lookup(self, token_ids: list[int], max_blocks: int) -> list[int]:
        """Cached blocks holding the longest prefix of token_ids (at most max_blocks); taken."""
        if not self.prefix_cache:
            return []
        bs, prev, hits = self.block_size, None, []
        for i in range(max_blocks):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            digest = block_digest(prev and prev.digest, tokens)
            block = self.cached.get(digest)
            # The digest only finds a candidate: its tokens and its parent must be equal too.
            if block is None or self.block_key[block] != (digest, _parent(prev), tokens):
                break
            hits.append(block)
            prev = ChainKey(digest, block, self.serial[block])
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_ids[block]
                self._idle_partners -= self.partner[block] >= 0
            self.ref_counts[block] += 1
        return hits

    def register(self, block: int, prev: ChainKey | None, tokens: tuple[int, ...]) -> ChainKey:
        """Record that `block` holds the KV of `tokens` after the chain `prev`; returns the chain
        key to pass for the next block.

        When an equal block is cached already, the key names that one, so that the next blocks
        chain onto what a later lookup will find. When a different block holds the same digest
        (a collision), the chain goes on from `block` itself, which is not cached: the blocks
        registered after it can never be found, and never be wrongly reused.
        """
        digest = block_digest(prev and prev.digest, tokens)
        entry = (digest, _parent(prev), tokens)
        holder = self.cached.get(digest) if self.prefix_cache else None
        if holder is None and self.prefix_cache and self.block_key[block] is None:
            self.block_key[block] = entry
            self.cached[digest] = holder = block
        elif holder is None or self.block_key[holder] != entry:
            holder = block
        return ChainKey(digest, holder, self.serial[holder])
