#!/usr/bin/env bash
# The GPU machine's check of issue 14's Hugging Face path: a GPT-2 written by
# transformers is fine-tuned by train_gpt (--init_from, ZeRO-3, on the GPU, at
# 1 and 2 ranks), the checkpoint is consolidated back to Hugging Face's
# layout, and transformers loads it and runs a forward.
#
#   hf_finetune_gpu_check.sh BUNDLE [WORK_DIR]
#
# BUNDLE: an unpacked gpu_bundle (tools/gpu_bundle.sh copies this script into
# it). Needs python3 with torch and transformers (the GPU machine has both).
# Every step has its own time limit and prints one line, so a hang shows
# where; results (one JSON line per load) go to $OUT/hf_finetune.jsonl when
# OUT is set. Exits non-zero when any step fails.
set -uo pipefail
bundle="$(cd "$1" && pwd)"
work="${2:-/tmp/hf_finetune_check}"
out="${OUT:-${work}}"
export LD_LIBRARY_PATH="${bundle}/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
# Two ranks share the one GPU here (the MPI backend stages through the host).
export ZE_ALLOW_GPU_SHARING=1
rm -rf "${work}"; mkdir -p "${work}/hf" "${out}"
failed=0
step() {  # name, limit in seconds, command...
  local name="$1" limit="$2"; shift 2
  local start=${SECONDS}
  timeout "${limit}" "$@" > "${work}/${name}.log" 2>&1
  local status=$?
  if ((status == 0)); then
    echo "ok   ${name} ($((SECONDS - start)) s)"
  else
    failed=1
    echo "FAIL ${name} (exit ${status}, $((SECONDS - start)) s); last lines:"
    tail -15 "${work}/${name}.log" | sed 's/^/    /'
  fi
  return ${status}
}

step write_hf 120 python3 -c "
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4))
model.save_pretrained('${work}/hf', safe_serialization=True)
print('parameters', sum(p.numel() for p in model.parameters()))
" || exit 1

for ranks in 1 2; do
  save="${work}/np${ranks}/checkpoints"  # does not exist yet
  step "train_np${ranks}" 180 mpirun --bind-to none -np "${ranks}" \
    "${bundle}/bin/train_gpt" --config="${bundle}/configs/stage3_bf16.json" \
    --init_from="${work}/hf/model.safetensors" --steps=30 --seq=64 \
    --device=cuda --save_dir="${save}" --progress=log &&
    grep "train_gpt:" "${work}/train_np${ranks}.log" | tail -2
  step "consolidate_np${ranks}" 120 "${bundle}/bin/ze_checkpoint" consolidate \
    "${save}" --out="${work}/np${ranks}/hf.safetensors" --format=hf-gpt2 \
    --dtype=bf16
  step "transformers_load_np${ranks}" 180 python3 \
    "${bundle}/hf_load_check.py" "${work}/np${ranks}/hf.safetensors" \
    --layers=4 --heads=4 --channels=256 --vocab=50257 &&
    tail -1 "${work}/transformers_load_np${ranks}.log" |
    tee -a "${out}/hf_finetune.jsonl"
done
echo "hf finetune check: $([[ ${failed} == 0 ]] && echo PASSED || echo FAILED)"
exit ${failed}
