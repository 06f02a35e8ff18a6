"""GPU benchmarks of the book's kernels against their peers; results land in ``kernels/results``."""
