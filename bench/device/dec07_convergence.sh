#!/bin/bash
# Issue 28's convergence runs: GPT-350M shape (24 layers, 16 heads, 1024
# channels; the byte vocabulary of 256) on the Linux kernel's documentation
# (bench/convergence/make_corpus.sh; carry .corpus/linux_doc.txt.xz), 2000
# steps of 4 x 1024 tokens, bf16, AdamW lr 6e-4 (100 warm-up steps, linear
# decay to step 2000), clipping 1.0, one run per moment format
# (bench/convergence/*.json: f32, bf16 to nearest, bf16 stochastic, 8-bit
# block-wise), all four at once on the one GPU. Validation loss every 100
# steps on the corpus's last tenth. LIMIT seconds (default 560).
source bench/device/setup.sh
LIMIT=${LIMIT:-560}
xz -dc .corpus/linux_doc.txt.xz > /tmp/linux_doc.txt
sha256sum /tmp/linux_doc.txt | cut -c1-16
pids=()
for v in f32 bf16_rne bf16_sr int8; do
  timeout $(( LIMIT - 30 )) $B/bin/train_gpt --config=bench/convergence/$v.json \
    --model=350M --data=text:/tmp/linux_doc.txt --seq=1024 --steps=2000 \
    --eval_every=100 --seed=1 --device=cuda --progress=log \
    > $OUT/$v.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; el "run pid $p rc=$?"; done
for v in f32 bf16_rne bf16_sr int8; do
  echo "$v: $(grep 'validation loss' $OUT/$v.log | tail -1) | $(tail -1 $OUT/$v.log | cut -c1-200)"
done
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
