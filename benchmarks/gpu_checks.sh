#!/usr/bin/env bash
# The checks that need a GPU, in one command, for a lent machine whose image has a CUDA PyTorch
# but no internet: the native trainer, torchtitan and Megatron-LM side by side, where the native
# step's time goes, Megatron-LM and torchtitan through their rendered launches, the native
# trainer's throughput, MFU and checkpoint stall, float8 against bf16, and resume. Each check has
# a time limit of its own, so that one that hangs leaves the others their time; outputs go to $OUT
# (default ./gpu-checks).
#
#   benchmarks/gpu_checks.sh WHEELS_DIR MEGATRON_LM_DIR [CHECK ...]
#
# WHEELS_DIR: Python wheels of the trainer's needs that the image lacks (DEVELOPERS.md lists
# them); MEGATRON_LM_DIR: Megatron-LM at tag core_v0.16.1. CHECK: any of side-by-side, profile,
# float8-8b, megatron-lm, gpu, float8, resume, torchtitan-tiny, torchtitan-1b, torchtitan-1b-float8
# (default: side-by-side and profile, one device session's worth; DEVELOPERS.md plans the rest).
set -u
wheels=$(realpath "$1") megatron=$(realpath "$2")
shift 2
checks=("${@:-side-by-side profile}")
out=${OUT:-$PWD/gpu-checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TMPDIR=/dev/shm  # the 1.5B model's 18 GB checkpoints stay off a slow disk

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import sys, torch; print("torch", torch.__version__, "python", sys.version.split()[0])'

# Megatron-LM where the runbooks' image has it. Its rank 0 runs `make` for the dataset helpers at
# every start: megatron-core's wheel has them built, and naming the extension suffix on make's
# command line (python3-config may be absent) makes that make a no-op.
mkdir -p /workspace && ln -sfn "$megatron" /workspace/Megatron-LM
cp /tmp/site/megatron/core/datasets/helpers_cpp*.so "$megatron"/megatron/core/datasets/
export MAKEFLAGS="LIBEXT=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"

run() {  # name, seconds, command...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T), at most ${limit} s)"
    timeout "$limit" "$@" >"$out/$name.txt" 2>&1
    echo "exit $?"
    grep -v -i "warn" "$out/$name.txt" | tail -n 8
}
for check in ${checks[*]}; do
    case $check in
        side-by-side) run side-by-side 370 python3 benchmarks/side_by_side_gpu.py 1b --steps 40 ;;
        profile) run profile 190 python3 benchmarks/train_benchmark.py profile --steps 20 ;;
        float8-8b) run float8-8b 540 python3 benchmarks/train_benchmark.py float8 --layers 8 --micro-batch 4 --global-batch 8 --steps 200 ;;
        megatron-lm) run megatron-lm 240 python3 benchmarks/megatron_lm_gpu.py --keep-log "$out/megatron-lm-node-0.log" ;;
        gpu) run gpu 240 python3 benchmarks/train_benchmark.py gpu --steps 36 --checkpoint-interval 12 ;;
        float8) run float8 200 python3 benchmarks/train_benchmark.py float8 --steps 60 --global-batch 8 ;;
        resume) run resume 180 python3 benchmarks/train_benchmark.py resume ;;
        # torchrun from the image's Python; trainer.torchtitan_configs from the repository root
        torchtitan-tiny) run torchtitan-tiny 180 python3 benchmarks/torchtitan_gpu.py tiny --steps 20 --keep-log "$out/torchtitan-tiny-node-0.log" ;;
        torchtitan-1b) run torchtitan-1b 300 python3 benchmarks/torchtitan_gpu.py 1b --steps 60 --keep-log "$out/torchtitan-1b-node-0.log" ;;
        torchtitan-1b-float8) run torchtitan-1b-float8 300 python3 benchmarks/torchtitan_gpu.py 1b --steps 60 --float8 ;;
        *) echo "unknown check $check: choose side-by-side, profile, float8-8b, megatron-lm, gpu, float8, resume, torchtitan-tiny, torchtitan-1b or torchtitan-1b-float8"; exit 2 ;;
    esac
done
