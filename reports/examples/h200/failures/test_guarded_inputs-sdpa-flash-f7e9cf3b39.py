#!/usr/bin/env python3
"""Reproducer: sdpa-flash · guarded_inputs (fail)

NotImplementedError: SDPA's FLASH_ATTENTION kernel refused this call: Memory Efficient attention has
been runtime disabled.; Flash attention does not support the is_causal flag when seqlen_q !=
seqlen_k. Got seqlen_q: 4 seqlen_k: 1. If you …

Check:    conformance/spec/test_unwritten_memory.py::test_guarded_inputs[sdpa-flash]
Problem:  Problem(seqlens_q=[4], seqlens_k=[1], head_dim=16, dtype='float16', causal='top_left', broadcast_q=True, length_law='uniform')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0775c4ab912c with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_guarded_inputs-sdpa-flash-f7e9cf3b39.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_guarded_inputs-sdpa-flash-f7e9cf3b39.py --backend reference  the same problem on another backend
    python test_guarded_inputs-sdpa-flash-f7e9cf3b39.py --device cuda:1      on another device

It reruns the check (test_guarded_inputs) on the problem as the run did and judges the result
against the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'sdpa-flash',
 'device': 'cuda',
 'check': 'test_guarded_inputs',
 'params': {},
 'problem': {'seqlens_q': [4],
             'seqlens_k': [1],
             'heads_q': 1,
             'heads_kv': 1,
             'head_dim': 16,
             'head_dim_v': None,
             'dtype': 'float16',
             'causal': 'top_left',
             'broadcast_q': True,
             'scale': None,
             'seed': 0,
             'length_law': 'uniform'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_unwritten_memory.py::test_guarded_inputs[sdpa-flash]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
