"""Prints train_bench's JSON lines from OUT/NAME.jsonl for base and each
NAME, then each NAME's tokens/s over base's per (model, stage, offload).

Usage: summarize_pairs.py OUT NAME...   (bench/device/pairs.sh's summarize)
"""
import json
import sys


def main():
    out, names = sys.argv[1], sys.argv[2:]
    rows = {}
    for name in ['base'] + names:
        try:
            lines = open(f'{out}/{name}.jsonl').read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            key = (d.get('model'), d.get('stage'), d.get('offload'))
            print(name, key, d.get('tokens_per_s'), d.get('step_ms'),
                  d.get('speculation'), d.get('offload_worker'),
                  d.get('error'))
            rows.setdefault(key, {})[name] = d.get('tokens_per_s')
    for key, r in rows.items():
        for name in names:
            if r.get('base') and r.get(name):
                print('ratio', name, key, round(r[name] / r['base'], 4))


if __name__ == '__main__':
    main()
