#!/usr/bin/env bash
# The CUDA path of clbench, checked on a lent GPU machine (the `device` tool of the tool library; see
# docs/gpu_check.md for what it showed). Run from the repository root there, with:
#   .whl/                 wheels of what that machine lacks (avalanche-lib, continuum, opacus, ...; cp312), and
#                         optionally clbench's own wheel (else the checkout is installed)
#   .gpudata/stubs/wandb  a stand-in module: avalanche imports wandb at import time and there is no registry there
#   .gpudata/cifar100_subset.npz  real CIFAR-100 pixels, 60 train / 12 test per class
#                         (benchmarks/gpu_check_cifar.py: the full file is 160 MB, a call carries at most 64 MiB)
# Parts (each under its own time limit, so one that hangs leaves the others' results):
#   1. the quick suite's non-private rows, seed 0, --device cuda --amp (accuracies comparable with the CPU
#      reference's seed 0; --amp refuses private training)
#   2. cifar100_full's baselines (full presets: ResNet-32, SGD 0.1, batch 128) at 1 epoch per step, B0 10 steps,
#      on the subset
#   3. dytox_full's first step (the paper's CIFAR model, dim 384, 5 SABs + TAB) for 3 epochs, on the subset
# then per-epoch timings from the records (benchmarks/gpu_check_summary.py). Everything lands in $OUT.
set -uo pipefail
REPO="$(pwd)"
OUT="${OUT:-$REPO/results/gpu_check}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
# clbench itself: a carried wheel (built from a committed tree while the checkout is being edited), else the checkout
if ! ls .whl/clbench-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . || exit 1
fi
export PYTHONPATH="/tmp/site:$REPO/.gpudata/stubs"
export CLBENCH_SUBSET="$REPO/.gpudata/cifar100_subset.npz"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
WORK="$(mktemp -d)"     # run outside the checkout: clbench comes from /tmp/site alone
cd "$WORK" || exit 1
python3 -c "import clbench, torch; print('clbench', clbench.__version__, clbench.__file__); print('torch',
torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
CL="python3 -m clbench"

cat > cifar_gpu.yaml <<'YAML'
suite: cifar100_full_gpu_check
description: cifar100_full's baselines (full presets) at 1 epoch per step on the CIFAR-100 subset of gpu_check_cifar.py
seeds: [0]
scenarios:
  - {name: split_cifar100_subset, label: b0_10steps, args: {path: $CLBENCH_SUBSET, n_experiences: 10, class_order: 1}}
strategies:
  - {name: naive, preset: full, args: {model: resnet32, epochs: 1}}
  - {name: replay, preset: full, args: {model: resnet32, mem_size: 2000, epochs: 1}}
  - {name: icarl, preset: full, args: {model: resnet32, mem_size: 2000, epochs: 1}}
  - {name: der_dark, preset: full, args: {model: resnet32, mem_size: 2000, epochs: 1}}
YAML
cat > dytox_gpu.yaml <<'YAML'
suite: dytox_full_gpu_check
description: dytox_full's first step (10 classes of class order 1) for 3 epochs on the CIFAR-100 subset
seeds: [0]
scenarios:
  - {name: split_cifar100_subset, label: step1_order1, args: {path: $CLBENCH_SUBSET, n_experiences: 1, classes: 10,
     class_order: 1}}
strategies:
  - {name: dytox, preset: full, args: {mem_size: 2000, epochs: 3, warmup_epochs: 1}}
YAML

part() {   # part NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@"
    echo "=== $name: exit $? after $((SECONDS - t0)) s"
}
# the quick suite without its private rows (--amp refuses dp: bf16 products cannot meet the first-step invariant)
python3 - <<'PY'
import importlib.resources, yaml
suite = yaml.safe_load(importlib.resources.files("clbench").joinpath("suites/quick.yaml").read_text())
suite["strategies"] = [e for e in suite["strategies"] if "dp" not in e
                      and not any(c["name"] == "dp" for c in e.get("callbacks", []))]
open("quick_amp.yaml", "w").write(yaml.safe_dump(suite, sort_keys=False))
PY
# throughput at paper-scale shapes on random data of the real shape (no data transfer): clbench vs a bare loop
part throughput 240 env -u CLBENCH_DATA python3 "$REPO/benchmarks/loop_throughput.py" --shape all --device cuda \
    --preset full --images 500 --repeats 3 --threads 4
part quick 180 $CL run --suite quick_amp.yaml --seeds 0 --device cuda --amp --jobs 4 --out quick --quiet --quiet-table
part cifar100 100 $CL run --suite cifar_gpu.yaml --plugins "$REPO/benchmarks/gpu_check_cifar.py" --device cuda --amp \
    --jobs 1 --out cifar100 --quiet
part dytox 100 $CL run --suite dytox_gpu.yaml --plugins "$REPO/benchmarks/gpu_check_cifar.py" --device cuda --amp \
    --jobs 1 --out dytox --quiet
python3 "$REPO/benchmarks/gpu_check_summary.py" quick cifar100 dytox --reference "$REPO/results/reference/quick" | tee "$OUT/summary.md"
tar -czf "$OUT/gpu_check_results.tar.gz" --exclude='*.pt' --exclude='state' quick cifar100 dytox cifar_gpu.yaml dytox_gpu.yaml quick_amp.yaml
