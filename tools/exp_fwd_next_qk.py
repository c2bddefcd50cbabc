"""Experiment (perf/LOG.md v35): the Gluon forward's next item's first QK^T issued before the item before writes
its O (Config.fwd_next_qk: 0 off; 1 issued while O and LSE go out; 3 the same with the scores, not P, carried
into the next item).  Compares each mode's O and LSE bit for bit against mode 0 on a GPU and prints the rows that
differ.  Run from the repository root: PYTHONPATH=$PWD python3 tools/exp_fwd_next_qk.py"""
import sys, torch
sys.path.insert(0, "tests")
from test_kernels import make_inputs
from kernels import Config, jagged_flash_attention
torch.manual_seed(0)
clean = {3: True}
def spans(r):
    out = []
    for x in r:
        if out and x == out[-1][1] + 1: out[-1][1] = x
        else: out.append([x, x])
    return out
for case, (lq_, lk_, hq, hkv, d, dv) in enumerate([([300, 0, 513, 129, 64, 700, 1, 65], [257, 5, 513, 400, 0, 200, 1, 64], 4, 2, 128, 128),
                                                  ([100, 257], [129, 80], 2, 2, 128, 64),
                                                  ([1024] * 4, [1024] * 4, 2, 2, 128, 128)]):
    for causal in (False, True):
        q, k, v, cu_q, cu_k = make_inputs(lq_, lk_, hq, hkv, d, dv, torch.bfloat16, False, 0, torch.int32)
        args = (q.cuda(), k.cuda(), v.cuda(), cu_q.cuda(), cu_k.cuda(), max(lq_), max(lk_))
        for programs in (1, 3):
            res = {m: jagged_flash_attention(*args, causal=causal, config=Config(gluon_split_keys=0, gluon_programs=programs, fwd_next_qk=m)) for m in (0, 3)}
            o0, l0 = res[0]
            msg = []
            for m in (3,):
                o1, l1 = res[m]
                bad = ~((l0 == l1) | (torch.isneginf(l0) & torch.isneginf(l1)))
                obad = (o0 != o1).any(-1).T
                clean[m] = clean[m] and not bad.any().item() and not obad.any().item()
                msg.append(f"mode{m}: lse {spans(bad.any(0).nonzero().flatten().tolist())[:6]} O {spans(obad.any(0).nonzero().flatten().tolist())[:6]}")
            print(f"case{case} causal={int(causal)} p={programs}: " + " | ".join(msg), flush=True)
for m in (3,):
    print('CLEAN', m, clean[m])
