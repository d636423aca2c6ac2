"""Boolean matrices packed into 64-bit words, for row-wise AND/OR over many rows at once.

A row of ``width`` booleans becomes ``ceil(width / 64)`` ``uint64`` words (``np.packbits`` order, padded
with zeros), so combining rows with ``np.bitwise_and.reduceat`` or ``np.bitwise_or.reduceat`` touches 64
columns per element instead of one.
"""

from __future__ import annotations

import numpy as np


def pack_rows(matrix: np.ndarray) -> np.ndarray:
    """Boolean ``(rows, width)`` -> ``uint64`` words ``(rows, ceil(width / 64))``."""
    packed = np.packbits(matrix, axis=1)
    pad = -packed.shape[1] % 8
    if pad:
        packed = np.concatenate([packed, np.zeros((packed.shape[0], pad), dtype=np.uint8)], axis=1)
    return np.ascontiguousarray(packed).view(np.uint64)


def unpack_rows(words: np.ndarray, width: int) -> np.ndarray:
    """Inverse of :func:`pack_rows`: ``uint64`` ``(rows, words)`` -> boolean ``(rows, width)``."""
    return np.unpackbits(np.ascontiguousarray(words).view(np.uint8), axis=1, count=width).view(bool)


def set_bits(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(row, column)`` of the set bits of packed rows, in row-major order: ``np.nonzero`` of the unpacked
    matrix, but scanning bytes (most are zero in a sparse matrix), not booleans."""
    packed = np.ascontiguousarray(words).view(np.uint8)
    rows, byte = np.nonzero(packed)
    hit, bit = np.nonzero(np.unpackbits(packed[rows, byte][:, None], axis=1))
    return rows[hit], byte[hit] * 8 + bit


def unit_rows(n: int) -> np.ndarray:
    """The packed ``(n, n)`` identity: row ``i`` has only bit ``i`` set (the :func:`pack_rows` layout)."""
    words = np.zeros((n, (n + 63) // 64), dtype=np.uint64)
    i = np.arange(n)
    words.view(np.uint8)[i, i // 8] = 0x80 >> (i % 8)  # np.packbits: the first column is a byte's high bit
    return words
