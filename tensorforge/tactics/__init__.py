"""Tactics: the candidate implementations of each op (kernel family × config), careful timing and the timing cache.

`timing.measure` times one candidate on a device (warm-up, L2 flush, median of many; a failing candidate scores
`inf`); `timing_cache.TimingCache` keeps those times in a file keyed by a stable signature of the device, the
software versions and the op, so that a rebuild does not time again.
"""
