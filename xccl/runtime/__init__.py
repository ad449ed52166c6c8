"""The runtime: ``xccl.init``, the world, and the state of every process group."""
