#!/bin/bash
# Is a GPU training run reproducible on one machine? Run 69's convergence
# runs differed from run 68's (another GPU) already at step 100 with the
# same seed. The 350M byte-level run of bench/convergence (f32
# moments) twice, one after the other, 200 steps, then the losses at
# steps 100-200 and the final validation loss side by side. Carry gpu_pack
# and .corpus/linux_doc.txt.xz.
source bench/device/setup.sh
xz -dc .corpus/linux_doc.txt.xz > /tmp/linux_doc.txt
for v in f32; do for n in 1 2; do
  timeout 100 $B/bin/train_gpt --config=bench/convergence/$v.json \
    --model=350M --data=text:/tmp/linux_doc.txt --seq=512 --steps=200 \
    --eval_windows=64 --seed=1 --device=cuda --progress=log \
    > $OUT/det_${v}_$n.log 2>&1
  el "$v run $n rc=$?"
done; done
for f in $OUT/det_*.log; do
  echo "$(basename $f): $(grep -o 'step [0-9]* loss [0-9.]*' $f | awk '{print $2":"$4}' | tr '\n' ' ') val $(grep 'validation loss' $f | tail -1 | awk '{print $NF}')"
done
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
