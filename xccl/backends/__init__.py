"""Built-in plugins: ``cpu`` (gloo) and ``cuda`` (nccl), registered through the same entry points as any other."""
