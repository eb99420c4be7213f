"""Operations: the `stator` CLI, the local cluster tool, logging, benchmarks."""
