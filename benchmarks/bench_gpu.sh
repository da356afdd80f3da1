#!/usr/bin/env bash
# Every GPU figure in docs/perf.md and docs/scaling.md, in one go, on one CUDA device.
# Usage: benchmarks/bench_gpu.sh OUT_DIR [part ...]   parts: tests bench scaling attention matrix (default: all)
# Needs python-chess, papermill (for the matrix notebook), transformers and trl beside torch, and
# Stockfish on the PATH or in STOCKFISH_PATH. Writes one JSON (or executed notebook) per part.
# Python: $PYTHON, else the checkout's .venv/bin/python (`make setup`), else python3 on the PATH.
set -uo pipefail
out=${1:?usage: benchmarks/bench_gpu.sh OUT_DIR [part ...]}
shift
parts=${*:-tests bench scaling attention matrix}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the matrix part runs its notebook from notebooks/ (papermill --cwd)
venv_py="$(dirname "$0")/../.venv/bin/python"
[ -x "$venv_py" ] || venv_py=python3
py=${PYTHON:-$venv_py}
status=0
for part in $parts; do
  echo "== $part $(date -u +%FT%TZ)"
  case $part in
    tests)    # the CUDA-only tests, plus the modules whose GPU paths they exercise
      $py -m pytest -q -p no:cacheprovider tests/test_sampling.py tests/test_model.py tests/test_lm_head_loss.py \
        tests/test_train_utils.py tests/test_perf.py 2>&1 | tail -n 15 || status=1 ;;
    bench)    # GPT-2 124M, bf16, side by side with transformers and TRL, plus the rollout sweep
      $py -m rookworld_lib.lab.cli bench --device cuda --rollout-sweep --json --out "$out/bench_gpu.json" \
        > "$out/bench_gpu.log" 2>&1 || status=1
      tail -n 25 "$out/bench_gpu.log" | grep '^\[bench\]' ;;
    scaling)  # one-GPU SFT tokens/s (with MFU) and GRPO samples/s
      $py benchmarks/bench_scaling.py --device cuda --model gpt2 --sft-batch-size 16 --block-size 1024 --compile \
        --sft-steps 12 --pad-vocab 64 --prompts 64 --group-size 8 --max-new-tokens 96 --json "$out/scaling_gpu.json" \
        || status=1 ;;
    attention)  # GRPO steps with and without cuDNN attention, interleaved (the gpu profile's step)
      $py benchmarks/bench_grpo_attention.py --json "$out/grpo_attention_gpu.json" || status=1 ;;
    matrix)   # notebook 04 at the GPT-2 124M scale, compile rows included
      $py -m papermill notebooks/04_mfu_tuning.ipynb "$out/04_mfu_tuning_gpu.ipynb" --cwd notebooks \
        -p device cuda -p allow_compile True -p figures_dir "$out" -p results_path "$out/matrix_gpu.json" \
        -p trace_dir "$out/traces" --log-output 2>&1 | grep -v 'WARNING\|^$' | tail -n 20 || status=1 ;;
    *) echo "unknown part $part"; status=2 ;;
  esac
done
exit $status
