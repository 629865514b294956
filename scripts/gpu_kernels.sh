#!/usr/bin/env bash
# On a CUDA machine: the GPU tests and the kernel benchmarks, in stages, each under a time limit, each writing its
# output under OUTPUT_DIR as it goes (so a stage cut off by its limit still leaves what it did).
#
#   scripts/gpu_kernels.sh OUTPUT_DIR [STAGE ...]      (default stages: tests parallel sweep)
#
# Stages (limits in seconds, environment overridable):
#   gluon     the Gluon kernel's GPU tests alone, serially, stopping at the first failure (GLUON_S=150): a wrong
#             barrier phase hangs a warp-specialized kernel, and this stage's limit ends that before the others run
#   tests     pytest -m gpu over the kernel, tactic, runtime and build tests (TESTS_S=300; WORKERS=12 processes
#             when pytest-xdist is installed; TESTS="paths" to choose)
#   parallel  bench/parallel_compile.py: candidates built by 1 worker thread against 8 (PARALLEL_S=150)
#   sweep     bench/conv_sweep.py: every distinct conv layer, our kernels against cuDNN (SWEEP_S=300, SWEEP_ARGS)
#   configs   bench/conv_configs.py: ResNet-50's convolutions over a wide grid of tiles and pipeline depths (CONFIGS_S=300,
#             CONFIGS_ARGS)
#   suite     bench/suite.py (SUITE_S=400, SUITE_ARGS; results merged into OUTPUT_DIR/suite; its engines kept in
#             OUTPUT_DIR/engines, for `profile`, with each build's timing cache beside them: *.timing.json, and the
#             quantized engines' `inspect` output: *.inspect.txt, which says the chainings tried and kept)
#   int8      ResNet-50 engines in fp16, int8 and fp8 (INT8_S=500; INT8_BATCHES="1 256", INT8_PRECISIONS="fp16 int8 fp8";
#             engines kept for `profile`; INT8_ARGS, e.g. "--families vendor triton fallback")
#             (suite and int8: TIMING_CACHES=DIR starts each build from DIR/MODEL-bBATCH-PREC.timing.json, an earlier
#             call's OUTPUT_DIR/engines carried back: on the same kind of device the build compiles a kernel a layer)
#   layers    bench/quantized_layers.py: ResNet-50's quantized layers, quantized kernels against the float fallback
#             (LAYERS="int8:always fp8:always" precision:chain pairs, LAYERS_BATCH=256, LAYERS_S=400 in all, LAYERS_ARGS)
#   zoo       MobileNetV3 and EfficientNet-B0 fp16 at batch 1 and 256 against eager + graph and torch.compile (ZOO_S=500
#             shared by the models; ZOO_MODELS, ZOO_BATCHES to choose: a depthwise net's build takes about 130 s)
#   max       fp16 engines beside torch.compile max-autotune (MAX_S=550 shared by the models; MAX_MODELS=resnet50,
#             MAX_BATCH=256; max-autotune compiles a depthwise net for about 5 minutes: one model a call)
#   profile   a zoo model's engines (the suite's or int8's, when it built them) profiled layer by layer, with `inspect`
#             (PROFILE_MODEL=yolo, PROFILE_BATCH=64, PROFILE_SIZE=640, PROFILE_PRECISION="fp16" or a list, e.g.
#             "int8 fp8", one engine each; PROFILE_S=400 for all; files named MODEL-bBATCH-PRECISION;
#             PROFILE_CANDIDATES="name ..." lists every candidate timed for the layers whose names contain those)
#   stem      bench/stem.py: ResNet-50's stem in its parts (space to depth, per tap and per row of taps, fp16 and int8)
#             beside cuDNN (STEM_BATCH=256, STEM_S=150)
#   epilogue8 bench/int8_epilogue.py: an int8 layer's epilogue in several forms, each in its own process
#             (EPILOGUE8_S=240, EPILOGUE8_BATCH=256)
#   merge     bench/residual_merge.py: ResNet-50's projection shortcuts as today's two layers against one convolution
#             over the concatenation, each autotuned over every family (fp16; MERGE_BATCH=256, MERGE_S=300,
#             MERGE_STAGES="layer1 layer2 layer3 layer4")
#   epilogue  bench/gemm_epilogue.py: a GEMM's activation epilogue (none, ReLU, tanh and erf GELU) on ConvNeXt's pw1
#             and BERT's FF1 products beside cuBLAS + torch (EPILOGUE_S=240)
#   copies    bench/copies.py: our tiled strided copy against torch on concatenations and layout changes
#             (COPIES_BATCH=64, COPIES_S=120)
#   fp8acc    bench/fp8_accumulation.py: E4M3 products with their sums promoted and not, beside int8 and fp16
#             (FP8ACC_S=150)
#   sparse    bench/sparse_gemm.py (2:4 products beside cuBLAS, SPARSE_GEMM_S=120), then bench/families.py on
#             SPARSE_MODELS="bert_base:128:64 resnet50:224:256" (model:size:batch) pruned by --sparsity force, with and
#             without the sparse family (SPARSE_MODEL_S=200 each; SPARSE_PRECISIONS="fp32 fp16", the builds' allowed
#             precisions: fp32 always among them)
#   norms     bench/layer_norm.py: a transformer norm's forms (fp16, int8, both) beside cuda.layernorm and torch
#             (NORMS_S=90)
#   buildtime one engine built without and with the compile pass before tuning, fresh processes and compile caches
#             (BUILD_MODEL=yolo, BUILD_BATCH=64, BUILDTIME_S=500 for both)
set -uo pipefail
out=${1:?output directory}
shift
stages=${*:-tests parallel sweep}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the bench scripts import tensorforge from this tree
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$out/device.txt"

inspect_quantized() {  # the kept quantized engines' layers: tactics and runner-ups, and the chainings tried
  for engine in "$out"/engines/*-int8.engine "$out"/engines/*-fp8.engine; do
    if [[ -f $engine ]]; then
      python3 -m tensorforge inspect "$engine" > "${engine%.engine}.inspect.txt" 2>&1
    fi
  done
}

for stage in $stages; do
  started=$(date +%s)
  case $stage in
    gluon)
      timeout "${GLUON_S:-150}" python3 -m pytest -m gpu -x -v -p no:cacheprovider tests/kernels/test_gluon_gemm.py \
        > "$out/gluon.txt" 2>&1
      echo "gluon stage exit $? (124: timed out)"
      grep -cE "PASSED" "$out/gluon.txt" | sed 's/^/passed: /'
      grep -E "FAILED|ERROR|Error" "$out/gluon.txt" | head -20
      ;;
    tests)
      parallel=()
      python3 -c "import xdist" 2>/dev/null && parallel=(-n "${WORKERS:-12}")
      # shellcheck disable=SC2086 - TESTS is a list of paths
      timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -v -p no:cacheprovider "${parallel[@]}" -rfE \
        ${TESTS:-tests/kernels tests/tactics tests/runtime tests/build tests/quant tests/cli} > "$out/tests.txt" 2>&1
      grep -cE "PASSED" "$out/tests.txt" | sed 's/^/passed: /'
      grep -E "FAILED|ERROR" "$out/tests.txt" | head -30
      tail -3 "$out/tests.txt"
      ;;
    parallel)
      timeout "${PARALLEL_S:-150}" python3 bench/parallel_compile.py --out "$out" 2>&1 | tail -6
      ;;
    sweep)
      # shellcheck disable=SC2086 - SWEEP_ARGS is a list of arguments
      timeout "${SWEEP_S:-300}" python3 bench/conv_sweep.py ${SWEEP_ARGS:---model resnet50 --batch 1 --effort 0} \
        --out "$out" > "$out/sweep.txt" 2>&1
      grep -E 'Our kernels win' "$out/sweep.txt" | tail -4
      ;;
    configs)
      # shellcheck disable=SC2086 - CONFIGS_ARGS is a list of arguments
      timeout "${CONFIGS_S:-300}" python3 bench/conv_configs.py --seconds "$(( ${CONFIGS_S:-300} - 60 ))" \
        ${CONFIGS_ARGS:---precision int8} --out "$out" > "$out/configs.txt" 2>&1
      cut -c1-200 "$out/configs.txt" | tail -16
      ;;
    suite)
      # shellcheck disable=SC2086 - SUITE_ARGS is a list of arguments
      timeout "${SUITE_S:-400}" python3 bench/suite.py ${SUITE_ARGS:---models resnet50 --precision fp16} --merge \
        --out "$out/suite" --engines "$out/engines" ${TIMING_CACHES:+--timing-caches "$TIMING_CACHES"} \
        > "$out/suite.txt" 2>&1
      tail -25 "$out/suite.txt"
      inspect_quantized
      ;;
    int8)
      batches=()
      for batch in ${INT8_BATCHES:-1 256}; do batches+=(--batch "$batch"); done
      precisions=()
      for precision in ${INT8_PRECISIONS:-fp16 int8 fp8}; do precisions+=(--precision "$precision"); done
      timeout "${INT8_S:-500}" python3 bench/suite.py --models resnet50 "${batches[@]}" --systems tensorforge \
        "${precisions[@]}" --effort 0 --runs 30 --merge --out "$out/suite" --engines "$out/engines" ${INT8_ARGS:-} \
        ${TIMING_CACHES:+--timing-caches "$TIMING_CACHES"} > "$out/int8.txt" 2>&1
      grep -E "batch [0-9]+ " "$out/int8.txt" | cut -c1-160
      inspect_quantized
      ;;
    layers)
      deadline=$(( $(date +%s) + ${LAYERS_S:-400} ))
      for pair in ${LAYERS:-int8:always fp8:always}; do
        left=$(( deadline - $(date +%s) ))
        (( left > 0 )) || break
        timeout "$left" python3 bench/quantized_layers.py --model resnet50 --batch "${LAYERS_BATCH:-256}" \
          --precision "${pair%%:*}" --chain "${pair##*:}" --out "$out" ${LAYERS_ARGS:-} >> "$out/layers.txt" 2>&1
      done
      grep -E "win|chain" "$out/layers.txt" | cut -c1-200
      ;;
    zoo)
      # shellcheck disable=SC2206 - ZOO_MODELS is a list of names
      models=(${ZOO_MODELS:-mobilenetv3 efficientnet_b0})
      batches=()
      for batch in ${ZOO_BATCHES:-1 256}; do batches+=(--batch "$batch"); done
      for model in "${models[@]}"; do
        timeout "$(( ${ZOO_S:-500} / ${#models[@]} ))" python3 bench/suite.py --models "$model" "${batches[@]}" \
          --systems tensorforge eager+graph compile-ro compile --precision fp16 --effort 0 --runs 30 --merge \
          --out "$out/suite" >> "$out/zoo.txt" 2>&1
      done
      grep -E "batch [0-9]+ " "$out/zoo.txt" | cut -c1-160
      ;;
    max)
      # shellcheck disable=SC2206 - MAX_MODELS is a list of names
      models=(${MAX_MODELS:-resnet50})
      for model in "${models[@]}"; do
        timeout "$(( ${MAX_S:-550} / ${#models[@]} ))" python3 bench/suite.py --models "$model" \
          --batch "${MAX_BATCH:-256}" --systems compile-max tensorforge --precision fp16 --effort 0 --runs 30 \
          --merge --out "$out/suite" >> "$out/max.txt" 2>&1
      done
      grep -E "batch [0-9]+ " "$out/max.txt" | cut -c1-160
      ;;
    profile)
      model=${PROFILE_MODEL:-yolo}
      batch=${PROFILE_BATCH:-64}
      deadline=$(( $(date +%s) + ${PROFILE_S:-400} ))
      mkdir -p "$out/engines"
      for precision in ${PROFILE_PRECISION:-fp16}; do
        name="$model-b$batch-$precision"
        engine="$out/engines/$name.engine"  # the suite's engine when it built this one
        if [[ ! -f $engine && ( $precision == int8 || $precision == fp8 ) ]]; then
          echo "profile: no $name engine; a quantized one needs calibration data: run the int8 or suite stage" \
            "before profile in the same call (it keeps its engines until the script ends)"
          continue
        fi
        build=""
        [[ -f $engine ]] || build="
          python3 -c \"from tensorforge import zoo; import onnx; onnx.save(zoo.export('$model', batch=$batch,
            size=${PROFILE_SIZE:-640}, dynamic_batch=False), '$out/$model.onnx')\" &&
          python3 -m tensorforge build '$out/$model.onnx' -o '$engine' --$precision --effort 0 --device cuda \
            > '$out/build-$name.txt' 2>&1 &&"
        left=$(( deadline - $(date +%s) ))
        (( left > 0 )) || break
        timeout "$left" bash -c "$build
          python3 -m tensorforge profile '$engine' --runs 20 --top 40 > '$out/profile-$name.txt' 2>&1 &&
          python3 -m tensorforge profile '$engine' --runs 20 --json > '$out/profile-$name.json' 2>/dev/null &&
          python3 -m tensorforge inspect '$engine' > '$out/inspect-$name.txt' 2>&1"
        for layer in ${PROFILE_CANDIDATES:-}; do
          python3 -m tensorforge inspect "$engine" --candidates "$layer" >> "$out/candidates-$name.txt" 2>&1
        done
        rm -f "$out/$model.onnx"
        head -45 "$out/profile-$name.txt"
      done
      ;;
    stem)
      timeout "${STEM_S:-150}" python3 bench/stem.py --batch "${STEM_BATCH:-256}" --out "$out" > "$out/stem.txt" 2>&1
      cat "$out/stem.txt" | cut -c1-160 | tail -12
      ;;
    epilogue8)
      timeout "${EPILOGUE8_S:-240}" python3 bench/int8_epilogue.py --batch "${EPILOGUE8_BATCH:-256}" --out "$out" \
        > "$out/epilogue8.txt" 2>&1
      cut -c1-220 "$out/epilogue8.txt" | tail -9
      ;;
    merge)
      # shellcheck disable=SC2086 - MERGE_STAGES is a list of names
      timeout "${MERGE_S:-300}" python3 bench/residual_merge.py --batch "${MERGE_BATCH:-256}" --out "$out" \
        --stages ${MERGE_STAGES:-layer1 layer2 layer3 layer4} > "$out/merge.txt" 2>&1
      tail -6 "$out/merge.txt"
      ;;
    epilogue)
      timeout "${EPILOGUE_S:-240}" python3 bench/gemm_epilogue.py --out "$out" > "$out/epilogue.txt" 2>&1
      tail -9 "$out/epilogue.txt"
      ;;
    copies)
      timeout "${COPIES_S:-120}" python3 bench/copies.py --batch "${COPIES_BATCH:-64}" --out "$out" 2>&1 | tail -14
      ;;
    fp8acc)
      timeout "${FP8ACC_S:-150}" python3 bench/fp8_accumulation.py --out "$out" 2>&1 | tail -8
      ;;
    norms)
      timeout "${NORMS_S:-90}" python3 bench/layer_norm.py --out "$out" 2>&1 | tail -12
      ;;
    sparse)
      # 2:4 sparsity: each product on cuSPARSELt and CUTLASS beside cuBLAS, then each of SPARSE_MODELS built twice
      # on the same pruned weights (--sparsity force), with and without the sparse family, timed in alternation.
      timeout "${SPARSE_GEMM_S:-120}" python3 bench/sparse_gemm.py --out "$out/sparse" 2>&1 | tail -16
      precisions=()
      for precision in ${SPARSE_PRECISIONS:-fp32 fp16}; do precisions+=(--precision "$precision"); done
      for spec in ${SPARSE_MODELS:-bert_base:128:64 resnet50:224:256}; do
        IFS=: read -r model size batch <<< "$spec"
        timeout "${SPARSE_MODEL_S:-200}" python3 bench/families.py --model "$model" --size "$size" --batch "$batch" \
          "${precisions[@]}" --sparsity force --without sparse --runs 100 --out "$out/sparse" 2>&1 | tail -4
      done
      ;;
    buildtime)
      # The same engine built twice in fresh processes with empty compile caches: without, then with the compile
      # pass before tuning (tactics/precompile.py).
      for mode in --no-precompile ""; do
        # shellcheck disable=SC2086 - an empty mode is no argument
        TRITON_CACHE_DIR=$(mktemp -d) TENSORFORGE_CACHE=$(mktemp -d) timeout "$(( ${BUILDTIME_S:-500} / 2 ))" \
          python3 bench/suite.py --models "${BUILD_MODEL:-yolo}" --batch "${BUILD_BATCH:-64}" --systems tensorforge \
          --precision fp16 --effort 0 --runs 10 $mode --out "$out/buildtime${mode:+-without}" >> "$out/buildtime.txt" 2>&1
      done
      grep -E "batch [0-9]+ " "$out/buildtime.txt" | cut -c1-400
      ;;
    *)
      echo "unknown stage $stage (tests, parallel, sweep, configs, suite, int8, layers, zoo, max, profile, stem, merge, epilogue, copies, buildtime)" >&2
      ;;
  esac
  echo "== $stage: $(($(date +%s) - started)) s"
done
rm -f "$out"/engines/*.engine  # large; the stages' text files say what they held (the timing caches stay)
