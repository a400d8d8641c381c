# Sourced after setup.sh by the scripts that compare this commit's
# train_bench with another commit's (tools/baseline_bundle.sh COMMIT, carried
# as gpu_base) in one device call. LIMIT: the seconds the script may take
# (default 480); a run that would start with 40 or fewer left is skipped.
#   one NAME TAG FLAGS...  NAME base: the baseline's train_bench; any other
#                          NAME: this commit's. JSON lines into
#                          $OUT/NAME.jsonl, stderr into $OUT/NAME.err.
#   pair TAG FLAGS...      one base, then one head, with the same flags.
#   summarize NAME...      every JSON line's figures, then each NAME's
#                          tokens/s over base's per (model, stage, offload).
LIMIT=${LIMIT:-480}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
[[ -d /tmp/baseline ]] || tar xJf gpu_base/baseline.tar.xz -C /tmp
cat /tmp/baseline/COMMIT | tee $OUT/baseline_commit.txt
PAIRS_HEAD_LD=$LD_LIBRARY_PATH
one() {
  local name=$1 tag=$2; shift 2
  (( $(left) > 40 )) || { el "skip $name $tag"; return; }
  if [[ $name == base ]]; then
    LD_LIBRARY_PATH=/tmp/baseline/lib:/usr/local/cuda/lib64 timeout 120 \
      /tmp/baseline/bin/train_bench "$@" >> $OUT/base.jsonl 2>> $OUT/base.err
  else
    LD_LIBRARY_PATH=$PAIRS_HEAD_LD timeout 120 $B/bin/train_bench "$@" \
      >> $OUT/$name.jsonl 2>> $OUT/$name.err
  fi
  el "$name $tag rc=$?"
}
pair() { one base "$@"; one head "$@"; }
summarize() { python3 bench/device/summarize_pairs.py "$OUT" "$@"; }
