# `probe_serve`: Belady's `serve` for a `PolicyProbe` of the belady kind (_radix_pol_score.pxi),
# for the tests (tests/test_radix_pol_score.py). Part of engine_adapter/sim/_radix_run.pyx,
# included after _radix_probe.pxi.


def probe_serve(PolicyProbe probe, const int64_t[::1] keys, int64_t end):
    """`RadixBelady.serve(keys, end)` on the probe's policy: the request whose lookups are
    `keys`, ending at `end` in the lookup sequence, is being allocated."""
    _pol_serve(&probe.tree, &keys[0] if keys.shape[0] else NULL, keys.shape[0], end)
