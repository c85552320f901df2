"""The gateway process: KServe v2 over HTTP and gRPC, Triton's extensions, metrics."""
