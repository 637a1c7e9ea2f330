"""Side-by-side benchmark of Standard and AnchorMass (issue 7): timing, memory, ratios, reports.

`measure` times and measures one callable, `workloads` builds the measured sessions on top of
the SPEC 7 contract, `suite` runs both models through them in one process, `targets` turns the
measured numbers into the issue's ratios, `report` writes table / JSON / PNG.
"""
