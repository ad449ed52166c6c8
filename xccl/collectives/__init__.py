"""The collectives: dispatch to native kernels or emulations, faults, and the mismatch detector."""
