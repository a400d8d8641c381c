#!/bin/bash
# Second session of 2026-12-07, call 3 (carry gpu_pack): issue 28's
# activation pairs with a 1024-row loss chunk (call 2's attribution put the
# 1.3B's cpu_checkpointing peak in the output head's 2 GiB logits chunk),
# then the NVMe step with the disk's duplex baseline (offload_param's swap
# buffers sized for the 1.3B's token table: bench/device/nvme_param_buffers.json).
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=4 --warmup=2 --dtype=bf16 --stages=0 --checkpointing=1 --loss_chunk_rows=1024 --peak_attribution=1"
BENCH_TIMEOUT=60
bench ck13 --models=1.3B
bench cpu13 --models=1.3B --cpu_checkpointing=1
bench cpurc13 --models=1.3B --cpu_checkpointing=1 --recompute_activations=1
bench ckl1 --models=llama-1B
bench cpul1 --models=llama-1B --cpu_checkpointing=1
bench cpurcl1 --models=llama-1B --cpu_checkpointing=1 --recompute_activations=1
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','cpu_checkpointing','recompute_activations','step_ms','peak_bytes_above_initialize','error']})
  if 'peak_attribution' in d:
    for label, b in d['peak_attribution']['bytes_by_scope'][:6]: print('   %-40s %8.3f GB' % (label, b / 1e9))" | cut -c1-400
mkdir -p /tmp/nv
timeout $(( $(left) - 10 )) $B/bin/train_bench --models=1.3B --stages=3 \
  --batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --offload=both \
  --offload_device=nvme --offload_param_device=nvme --max_in_cpu=0 \
  --nvme_path=/tmp/nv --disk_baseline=1 --disk_baseline_bytes=4GiB \
  --ds_config_patch=bench/device/nvme_param_buffers.json \
  >> $OUT/nvme_train.jsonl 2>> $OUT/nvme_train.err
el "nvme train_bench rc=$?"
python3 -c "
import json
for l in open('$OUT/nvme_train.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['bench','model','step_ms','tokens_per_s','duplex','nvme','fraction_of_disk_duplex','error']})" | cut -c1-1200
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
