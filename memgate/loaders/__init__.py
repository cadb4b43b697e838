"""One loader per input format; only loaders know the writers' raw column names."""
