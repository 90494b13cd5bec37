"""CuKe: DICE's high-performance CUDA kernel dataset, rebuilt from validated pairs (``dice cuke build``).

Stages, one module each: ``readers`` (every source format, schema-checked) -> ``validate`` (the validator's
batch API on the GPU: correct and >= --min-speedup, cached and resumable; compile-only with --no-gpu) ->
``dedup`` (exact and MinHash near-duplicates, contamination against the evaluation problems) -> ``split``
(held-out problems, seeded) -> ``levels`` (single op / fused / whole model from the reference) ->
``augment`` (shape grids, layer blocks from a teacher) -> ``tasks`` (SFT, infill, end-to-end and ``.cu``
infill task files) -> ``report`` (funnel, histograms, card); ``build`` runs them. Layout and schemas:
``docs/CUKE.md``.
"""
