#!/usr/bin/env python3
"""Reproducer: flex · edge_case:mqa_8_to_1 · float16 (fail)

InductorError: NoValidChoicesError: No choices to select. Provided reason: No choices exist for
backend. please consider adding ATEN into max_autotune_gemm_backends config (defined in
torch/_inductor/config.py) to allow at least one choice.

Check:    conformance/spec/test_edge_cases.py::test_edge_case[flex-mqa_8_to_1-float16]
Problem:  Problem(seqlens_q=[5, 33], seqlens_k=[7, 33], heads_q=8, head_dim=32, dtype='float16', causal='none', scale=0.17677669529663687, length_law='observed')
          (the call in flight when the check's process died: the shapes and options are the ones
          that failed, the input values come from the problem's seed and may differ from the run's)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0775c4ab912c with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_edge_case-flex-a2b009e0bd.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_edge_case-flex-a2b009e0bd.py --backend reference  the same problem on another backend
    python test_edge_case-flex-a2b009e0bd.py --device cuda:1      on another device

It calls the backend once on the problem, forward and backward, and judges the result against the
float64 oracle; CUDA_LAUNCH_BLOCKING=1 makes a device fault surface at the kernel launch that caused
it.
"""
import os
import sys

REPRODUCER = {'backend': 'flex',
 'device': 'cuda',
 'check': 'test_edge_case',
 'params': {'case': 'mqa_8_to_1', 'dtype': 'float16'},
 'problem': {'seqlens_q': [5, 33],
             'seqlens_k': [7, 33],
             'heads_q': 8,
             'heads_kv': 1,
             'head_dim': 32,
             'head_dim_v': None,
             'dtype': 'float16',
             'causal': 'none',
             'broadcast_q': False,
             'scale': 0.17677669529663687,
             'seed': 0,
             'length_law': 'observed'},
 'mode': 'call',
 'gradients': True,
 'nodeid': 'conformance/spec/test_edge_cases.py::test_edge_case[flex-mqa_8_to_1-float16]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
