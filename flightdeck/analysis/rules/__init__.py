"""The diagnosis rules, one module each; `flightdeck.analysis.diagnose` asks them in order.

`mismatch` (collectives that differ across ranks), `p2p` (sends and recvs that do not pair),
`lost` (ranks that stopped reporting, hosts that went silent), `hang` (the oldest collective not
finished everywhere, and who holds it up; its sentences are in `hang_words`), `whereabouts`
(under file times: where a hang's culprits stopped), `missing` (ranks without a dump),
`stragglers` (arrival skew), `consequences` (which finding follows from which, and their order);
`common` holds what they share.
"""
