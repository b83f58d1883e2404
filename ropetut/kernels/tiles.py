"""Tile sizes for the kernels that rotate a tile of tokens x heads x pairs
(V2, V4, final)."""

import triton


def tile_sizes(
    T: int, H: int, half: int, pairs_per_tile: int = 2048
) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_HALF) for a tile of tokens x heads x pairs.

    All heads of a token share one cos/sin row, so a tile spans as many heads as fit in
    ``pairs_per_tile`` pairs, then as many tokens as still fit.
    """
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(H), max(1, pairs_per_tile // block_half))
    block_t = min(
        triton.next_power_of_2(T), max(1, pairs_per_tile // (block_h * block_half))
    )
    return block_t, block_h, block_half
