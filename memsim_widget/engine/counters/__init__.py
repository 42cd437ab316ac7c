"""The GPU's counters beyond the live tensors: ``overhead`` (workspaces, fragmentation, CUDA context, NCCL, and the
three counters' bands), ``allocator`` (PyTorch's caching allocator, replayed) and ``alloc_stream`` (a step's
allocations and frees from the engine's groups, replayed through it for ``reserved``)."""
