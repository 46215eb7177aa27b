#!/usr/bin/env bash
# scripts/gpu-bundle's folder runs where none of our Debian packages are:
# with an empty environment (env -i), asgd trains MNIST on the CPU, the test
# binary runs, and every library they load comes from the bundle except
# glibc's, the NVIDIA driver's and CUDA's own (which the bundle leaves to the
# target unless --with-cuda-libs). Exit 77 (ctest: skipped) without a CUDA
# backend in the build, patchelf, or $ASGD_DATA_DIR.
#
# usage: gpu_bundle_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
[[ -n ${ASGD_DATA_DIR:-} && -d $ASGD_DATA_DIR/mnist ]] || { echo "gpu_bundle_test: no \$ASGD_DATA_DIR/mnist" >&2; exit 77; }
command -v patchelf >/dev/null || { echo "gpu_bundle_test: no patchelf (scripts/setup installs it)" >&2; exit 77; }
[[ -f $build/lib/libasgd_cuda.so ]] || { echo "gpu_bundle_test: this build has no CUDA backend" >&2; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/asgd-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$source/scripts/gpu-bundle" "$work/made" --data "$ASGD_DATA_DIR" --build "$build"
mv "$work/made" "$work/bundle"  # the run path must not name where it was made
bundle="$work/bundle"
[[ -x $bundle/gpu-check && -f $bundle/bench/torch_compute.py && -f $bundle/data/mnist/train-images-idx3-ubyte.gz ]]

for b in bin/asgd bin/asgd-bench bin/asgd_tests lib/libasgd_cuda.so; do
  outside=$(env -i ldd "$bundle/$b" | awk '/=>/ {print $1, $3}' | grep -vF -e " $bundle/lib/" -e " $bundle/bin/../lib/" |
    grep -vE '^(libc|libm|libdl|libpthread|librt|libresolv|libutil)\.so|^(libcudart|libcublas|libcublasLt|libcudnn)\.so' || true)
  if [[ -n $outside ]]; then
    echo "gpu_bundle_test: $b loads libraries from outside the bundle:" >&2
    echo "$outside" >&2
    exit 1
  fi
done

env -i "$bundle/bin/asgd" train --data-dir "$bundle/data/mnist" --device cpu --epochs 1 \
  --metrics-out "$work/run.jsonl" >"$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }
grep -q '"final_test_accuracy":0.9[0-9]' "$work/run.jsonl" || { cat "$work/run.jsonl" >&2; exit 1; }
env -i "$bundle/bin/asgd_tests" --gtest_filter='Device.*' >"$work/tests.log" 2>&1 || { cat "$work/tests.log" >&2; exit 1; }
# asgd loads the bundle's CUDA plugin (here it finds no GPU, and says so
# in the driver's words, not the loader's).
status=0
env -i "$bundle/bin/asgd" train --data-dir "$bundle/data/mnist" --device cuda --epochs 1 >"$work/cuda.log" 2>&1 || status=$?
((status != 0)) && grep -q "no usable CUDA device" "$work/cuda.log" && ! grep -q "could not be loaded" "$work/cuda.log" ||
  { echo "gpu_bundle_test: asgd --device cuda did not load the bundle's plugin:" >&2; cat "$work/cuda.log" >&2; exit 1; }
# gpu-check refuses a step it does not know, naming the ones it does.
status=0
"$bundle/gpu-check" --steps nosuch >"$work/check.log" 2>&1 || status=$?
((status == 2)) && grep -q "unknown step 'nosuch'.*speed" "$work/check.log" || { cat "$work/check.log" >&2; exit 1; }
# `asgd bench` runs the asgd-bench beside it (gpu-check's compute benchmark).
env -i "$bundle/bin/asgd" bench compute --help >"$work/bench.log" 2>&1 || { cat "$work/bench.log" >&2; exit 1; }
echo "gpu_bundle_test: the bundle trained in an empty environment"
