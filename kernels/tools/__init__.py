"""GPU tools: bench.py (the timing table), gpu_check.sh (tests, spec, bench on a GPU)."""
