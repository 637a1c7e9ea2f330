"""Side-by-side benchmark of Standard and AnchorMass: timing, memory, ratios, reports.

`measure` times and measures one callable, `workloads` builds the measured sessions on top of
the model/cache contract (docs/method.md §7), `suite` runs both models through them in one
process, `targets` turns the measured numbers into the target ratios, `report` writes
table / JSON / PNG.
"""
