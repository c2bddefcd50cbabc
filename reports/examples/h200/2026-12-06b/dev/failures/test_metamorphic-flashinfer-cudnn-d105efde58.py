#!/usr/bin/env python3
"""Reproducer: flashinfer-cudnn · metamorphic:batch_split (crash)

forward: RuntimeError: execute(handle, plan->get_raw_desc(), variant_pack_descriptor.get_ptr())
failed with message: varPackPtrs[io_uid_idx] == nullptr && (REMOVED_IO_UIDS->find(io_uid) ==
REMOVED_IO_UIDS->end()), and code …

Check:    conformance/spec/test_metamorphic.py::test_metamorphic[flashinfer-cudnn-batch_split]
Problem:  Problem(seqlens_q=[16, 16, 16, 16, 16, 16, 16], seqlens_k=[16, 0, 0, 0, 0, 0, 31], heads_q=8, head_dim=128, dtype='float16', causal='none', broadcast_q=True, scale=0.05, length_law='uniform', offsets_dtype='int64')
          (the failing example)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0781d958d9cf with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_metamorphic-flashinfer-cudnn-d105efde58.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_metamorphic-flashinfer-cudnn-d105efde58.py --backend reference  the same problem on another backend
    python test_metamorphic-flashinfer-cudnn-d105efde58.py --device cuda:1      on another device

It reruns the check (test_metamorphic) on the problem as the run did and judges the result against
the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'flashinfer-cudnn',
 'device': 'cuda',
 'check': 'test_metamorphic',
 'params': {'relation': 'batch_split'},
 'problem': {'seqlens_q': [16, 16, 16, 16, 16, 16, 16],
             'seqlens_k': [16, 0, 0, 0, 0, 0, 31],
             'heads_q': 8,
             'heads_kv': 1,
             'head_dim': 128,
             'head_dim_v': None,
             'dtype': 'float16',
             'causal': 'none',
             'broadcast_q': True,
             'scale': 0.05,
             'seed': 0,
             'length_law': 'uniform',
             'offsets_dtype': 'int64',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_metamorphic.py::test_metamorphic[flashinfer-cudnn-batch_split]',
 'outcome': 'crash'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
