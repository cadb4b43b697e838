"""One loader per input format (:mod:`memgate.loaders.registry` lists them); only loaders know the writers'
raw column names."""
