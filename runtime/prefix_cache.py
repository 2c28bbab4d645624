"""Automatic prefix caching: full KV blocks found again by a hash chain over their tokens.

A block's key is a 16-byte blake2b digest of its parent's key and its token ids. The
first block's parent is the chain's root, a digest of the KV-scale table (version and
scales) and the KV dtype the chain was written under: a block's key names its whole
prefix and the table, so pages written under one table are never found under another.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec.kernels.paged_kv_cache import PagedKVCache
from specdec.runtime.kv_scales import KVScaleTable
from specdec.runtime.sequence import SequenceChunk

KEY_BYTES = 16


def root_key(kv_scales: KVScaleTable, kv_dtype: str) -> bytes:
    """The parent of a chain's first block: the table's version and its scales too, so
    that a table replaced under the same version is a new root as well."""
    text = f"specdec-kv-root/{kv_dtype}/{kv_scales.to_json()}"
    return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES).digest()


def block_key(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The key of the block holding ``token_ids`` after the block (or root) ``parent``."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=KEY_BYTES).digest()


@dataclass
class _Chain:
    """The token ids whose KV a sequence holds, and the keys of its first full blocks.

    ``root`` is the root it was written under (None while empty). ``keys`` covers every
    full block while ``root`` is the runner's current root; a chain written on under a
    newer table (a cache that is not FP8 allows it) stops there: it neither publishes nor
    matches again until truncated to empty.
    """

    root: bytes | None = None
    token_ids: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)


class PrefixCache:
    """The runner's prefix cache over a ``PagedKVCache``: tracks each open sequence's
    chain, publishes its full blocks, and gives a chunk the cached blocks it may take.

    Invariant: every tracked sequence holds as many tokens in the KV cache as its chain.
    """

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self._chains: dict[str, _Chain] = {}

    def open(self, seq_id: str) -> None:
        self._chains[seq_id] = _Chain()

    def release(self, seq_id: str) -> None:
        del self._chains[seq_id]

    def truncate(self, seq_id: str, length: int) -> None:
        """Follow a cut of the sequence to its first ``length`` tokens."""
        chain = self._chains[seq_id]
        del chain.token_ids[length:]
        del chain.keys[length // self.cache.page_size :]
        if not chain.token_ids:
            chain.root = None

    def match(self, chunk: SequenceChunk, root: bytes) -> tuple[int, int]:
        """Attach to the chunk's sequence the cached blocks that begin the chunk, in order
        up to the first miss; returns (tokens looked up, tokens attached).

        Only where the sequence ends on a block boundary with its chain known under
        ``root``, and only blocks that end at or before ``len(chunk.token_ids) -
        max(chunk.num_logits, 1)``: a chunk computes at least one token, and every token
        whose logits it asks for.
        """
        chain, page_size = self._chains[chunk.seq_id], self.cache.page_size
        if not self._known(chain, root) or len(chain.token_ids) % page_size:
            return 0, 0
        limit = len(chunk.token_ids) - max(chunk.num_logits, 1)
        parent = chain.keys[-1] if chain.keys else root
        pages, keys = [], []
        for start in range(0, limit - page_size + 1, page_size):
            key = block_key(parent, chunk.token_ids[start : start + page_size])
            page = self.cache.lookup(key)
            if page is None:
                break
            pages.append(page)
            keys.append(key)
            parent = key
        self.cache.attach(chunk.seq_id, pages)
        num_hit = len(pages) * page_size
        chain.root = root
        chain.token_ids += chunk.token_ids[:num_hit]
        chain.keys += keys
        return max(limit, 0) // page_size * page_size, num_hit

    def record(self, seq_id: str, token_ids: Sequence[int], root: bytes) -> None:
        """The sequence wrote the KV of ``token_ids`` (after what it held) under ``root``;
        publish the blocks this completes."""
        chain = self._chains[seq_id]
        if chain.root is None:
            chain.root = root
        known = self._known(chain, root)
        chain.token_ids += token_ids
        if not known:
            return
        page_size = self.cache.page_size
        for block in range(len(chain.keys), len(chain.token_ids) // page_size):
            parent = chain.keys[-1] if chain.keys else root
            tokens = chain.token_ids[block * page_size : (block + 1) * page_size]
            chain.keys.append(block_key(parent, tokens))
            self.cache.publish(seq_id, block, chain.keys[-1])

    def _known(self, chain: _Chain, root: bytes) -> bool:
        """Every full block's key is known, under ``root``."""
        full = len(chain.token_ids) // self.cache.page_size
        return chain.root in (None, root) and len(chain.keys) == full
