"""Inner attention kernels for the AnchorMass parallel path: exact block-wise SDPA and FlexAttention."""
