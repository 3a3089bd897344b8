#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""zo-plan's predicted step against zo-train's measured step, in alternating pairs.

    tools/zo-plan-vs-train.py [--build build] [--pairs 3] [--skip 2] -- ZO-TRAIN OPTIONS

Each pair runs `zo-plan --json -- OPTIONS` and then `zo-train --quiet --json FILE OPTIONS`
(both under `nice -n 10`), one right after the other so both see the same machine, and
prints the predicted step, the median measured step of the step lines after the first
`--skip` (the first steps fault pages in; with DPU they run undelayed), their ratio, each
side's split, how long each command took and the load average. The last line is the
median ratio over the pairs. Give zo-train a `--steps` of at least skip + 3.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    argv = sys.argv[1:]
    if '--' not in argv:
        sys.exit('usage: zo-plan-vs-train.py [--build DIR] [--pairs N] [--skip N] -- ZO-TRAIN OPTIONS')
    cut = argv.index('--')
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', default='build')
    ap.add_argument('--pairs', type=int, default=3)
    ap.add_argument('--skip', type=int, default=2)
    a = ap.parse_args(argv[:cut])
    line = argv[cut + 1:]
    nice = ['nice', '-n', '10']
    ratios = []
    for i in range(a.pairs):
        t0 = time.time()
        p = subprocess.run(nice + [os.path.join(a.build, 'tools', 'zo-plan'), '--json', '--'] + line,
                           capture_output=True, text=True)
        if p.returncode not in (0, 3):
            sys.exit('zo-plan failed (%d): %s' % (p.returncode, p.stderr))
        plan = json.loads(p.stdout)['predicted']
        t1 = time.time()
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, 'run.jsonl')
            r = subprocess.run(nice + [os.path.join(a.build, 'tools', 'zo-train'), '--quiet', '--json', out] + line,
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit('zo-train failed (%d): %s' % (r.returncode, r.stderr))
            steps = [j for j in map(json.loads, open(out)) if j.get('type') == 'step'][a.skip:]
        t2 = time.time()
        if not steps:
            sys.exit('zo-train ran no steps after the first %d: give it more --steps' % a.skip)

        def med(k):
            return statistics.median(s.get(k, 0.0) for s in steps)

        ratio = plan['step_ms'] / med('step_ms')
        ratios.append(ratio)
        keys = ('data_ms', 'compute_ms', 'update_ms', 'nvme_read_ms', 'optim_ms')
        print(json.dumps({
            'pair': i, 'load': round(os.getloadavg()[0], 1), 'plan_s': round(t1 - t0, 1), 'train_s': round(t2 - t1, 1),
            'predicted_ms': round(plan['step_ms'], 1), 'measured_ms': round(med('step_ms'), 1),
            'ratio': round(ratio, 3),
            'predicted': {k: round(plan[k], 1) for k in keys},
            'measured': {k: round(med(k), 1) for k in keys}}), flush=True)
    print(json.dumps({'median_ratio': round(statistics.median(ratios), 3), 'ratios': [round(x, 3) for x in ratios]}))


if __name__ == '__main__':
    main()
