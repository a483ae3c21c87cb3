"""Which CUDA graph a decode step replays: the cheapest measured at or above its size."""

from __future__ import annotations

from bulkgen.engine.graphs import DecodeGraphs, bucket_sizes, cheapest_at_or_above

# bf16 GEMM time of one 8B decode step by rows, measured on the H200 (scripts/bench_fp8_mm.py
# --rows at b5209a1): 448 rows cost more than 480 or 512.
H200_BF16 = {
    256: 6.73,
    288: 7.73,
    320: 7.84,
    384: 8.66,
    416: 10.01,
    448: 13.59,
    480: 10.56,
    512: 10.75,
}


def test_times_that_grow_with_the_size_keep_every_bucket():
    assert cheapest_at_or_above([1.0, 2.0, 2.0, 3.5]) == [0, 1, 2, 3]


def test_a_bucket_dearer_than_a_larger_one_replays_the_larger():
    sizes, ms = list(H200_BF16), list(H200_BF16.values())
    chosen = {b: sizes[j] for b, j in zip(sizes, cheapest_at_or_above(ms), strict=True)}
    assert chosen[448] == 480, "13.59 ms against 10.56"
    assert chosen[416] == 416 and chosen[480] == 480 and chosen[512] == 512


def test_the_cheapest_of_all_larger_buckets_wins_not_the_next_one():
    assert cheapest_at_or_above([9.0, 8.0, 5.0, 6.0]) == [2, 2, 2, 3]


def test_timing_noise_within_the_margin_never_moves_a_step_up():
    assert cheapest_at_or_above([10.0, 9.8, 9.75]) == [0, 1, 2], "2.5% is noise"
    assert cheapest_at_or_above([10.0, 9.6], margin=0.03) == [1, 1]
    assert cheapest_at_or_above([10.0, 9.6], margin=0.05) == [0, 1]


def test_bucket_for_pads_a_step_to_the_graph_its_bucket_points_at():
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # the mapping only: no CUDA graphs here
    graphs.buckets = bucket_sizes(512)
    ms = [float(b) for b in graphs.buckets]
    ms[graphs.buckets.index(448)] = 1000.0  # a 448-row graph dearer than every larger one
    graphs.serve = cheapest_at_or_above(ms)
    assert graphs.bucket_for(417) == graphs.bucket_for(448) == 480
    assert graphs.bucket_for(416) == 416 and graphs.bucket_for(449) == 480
    assert graphs.bucket_for(3) == 4 and graphs.bucket_for(512) == 512
    assert all(graphs.bucket_for(b) >= b for b in range(1, 513))
