#!/usr/bin/env bash
# One device call's steps, run on the GPU machine from the repository root (see tools/README.md):
#   tools/device/call.sh STEP...   with STEP one of
#   unpack       unpack .device/ (tools/device/pack.sh) and link the build-time checkout path
#   synth        write the full-size Lightning checkpoint (lightning-mixed) to /tmp/lt
#   synth-bg     the same in the background (waited for by the first step that needs /tmp/lt);
#                both keep a checkpoint an earlier call on the same warm machine finished
#   tests        every CUDA test with --ignored (deps/ops, deps/it's device modules, deps/memory
#                where packed)
#   tests-ops F  the ops tests whose names contain one of the comma-separated F, then deps/it's
#                device modules and deps/memory whole
#   it F         only deps/it's device tests whose names contain one of the comma-separated F
#   itenv E     deps/it's device modules with the environment assignment E (e.g.
#                NEMOTRON_SCAN_SSD=1: the whole-model tests with a kernel setting not the default)
#   b1 SETTINGS  engine decode at batch 1 after 1K and 8K prompts, one run per --mma-min setting
#   b1s S        engine decode at batch 1 after 1K and 8K prompts (64 steps, median of 2) on the
#                in-memory weights, once per --mma-min setting of the ;-separated S (`default`:
#                the library's defaults, in the same process)
#   bN SETTINGS  engine decode at batch 16 and 64 after 128-token prompts
#   pf           engine prefill: 1 x 1,024 and 8,192, 16 and 64 x 128, and 1 x 12,288 (past
#                the 10,922 tokens that crashed the slot-major expert grid), 8 decode steps
#   ops F        only the ops tests whose names contain one of the comma-separated F
#                (cuda_bf16::mma_linears compiles a kernel set per tuning: ≈ 400 s alone on an
#                H100; give it and cuda_bf16_tunings::* calls of their own)
#   pall         engine prefill and 64 decode steps at 1 x 1,024, 16 and 64 x 128 (one load)
#   pf3          pf without the 12,288-token prompt
#   p1           engine prefill of 1 x 1,024 and 8,192 tokens, 8 decode steps (one load)
#   pcmp S       pall's sizes (8 decode steps) once per --mma-min setting of the ;-separated S
#   p8 S         engine prefill of 1 x 8,192 tokens (8 decode steps) once per --mma-min setting
#                of the ;-separated S
#   pNcmp S      engine prefill and 8 decode steps at 16 and 64 x 128 once per --mma-min
#                setting of the ;-separated S (one load)
#   pBcmp S      pNcmp at 8, 16 and 64 x 128 (8 x 128: the rows of a 1K prompt)
#   pBs S        pBcmp on the same weights built in memory (bench --synthetic lightning --seed 0):
#                no synth step
#   p1s S        engine prefill of 1 x 1,024 and 8,192 tokens on the in-memory weights, once per
#                --mma-min setting of the ;-separated S
#   pch ST,PC    engine prefill of 1 x 8,192 tokens on the in-memory weights under a step token
#                budget ST and pieces of PC (bench --step-tokens ST --prefill-chunk PC)
#   plong ST,PC  engine prefill of 1 x 32,768 and 1 x 131,072 tokens on the in-memory weights (one
#                repeat), whole (ST,PC = 0,0) or under a step budget ST in pieces of PC, with what
#                the device's allocator holds after each
#   bmem F       engine decode at batch 256 after 128-token prompts, slots sized from F of the free
#                memory (bench --slot-memory F), on the in-memory weights
#   load29 C     issue 29's before/after: loadtest of a308dbc, of b4e2c45 and of this build at C
#                clients, one after another (loadtest_before/_after packed by hand, PERF 34)
#   bsweep S     engine decode at batch 64 and 256 after 128-token prompts, slots from 0.3 of the
#                free memory (`slotmem F` before it: F), once per --mma-min setting of the
#                ;-separated S (in-memory weights)
#   bold         issue 27's before/after: bench built at 059cb70^ (examples/bench_before, packed
#                by hand) and this build, decode at 1 / 16 / 64 after 128 tokens and a 1K prefill
#   bkv KV[,F]   engine decode at batch 1, 64 and 256 after 128-token prompts with the KV cache KV
#                (auto | fp8; bench --kv-cache-dtype), slots from F (0.3) of the free memory (the
#                f32 SSM state's 256 slots need 0.35 on an H100)
#   p16          engine prefill and 8 decode steps at 16 and 64 x 128 (one load)
#   p16s         p16 on the same weights built in memory (bench --synthetic lightning --seed 0):
#                no synth step, no checkpoint on disk
#   p12k         engine prefill of 1 x 12,288 tokens (one repeat)
#   hfm          HF + mamba_ssm's Triton kernels only, 1 x 1,024, 16 and 64 x 128 (one repeat)
#   pncu         ncu over one 1K prefill pass (every kernel's duration, CSV)
#   pncu16       the same over one 16 x 128 prefill pass
#   pncu64       the same over one 64 x 128 prefill pass
#   pncup B      ncu over one B x 128 prefill alone (examples/profile --prefill: the load and a
#                warm-up prefill outside the profiled range; kernel durations, CSV)
#   pncud B      ncu sections (speed of light, occupancy, warp states, compute and memory
#                workload) over the first 14 tensor-core, scan, router and attention kernels of
#                one B x 128 prefill pass
#   sass B S     ncu source counters (SASS per line: instructions executed, stalls), instruction
#                statistics and occupancy of the first launches of the tensor-core prefill kernels
#                in one B x 128 prefill under --mma-min S, with CubeCL's generated CUDA source of
#                every kernel (CUBECL_DEBUG_LOG); one sass_<S>.tar.xz
#   opsb F       ops F on deps/ops_broken (a deliberately broken build, packed by hand: it must
#                fail)
#   hf           HF transformers with and without mamba_ssm's Triton kernels (tools/hf_bench.py;
#                the second needs .whl/ carried: tools/mamba_peer/build.sh)
#   kern ONLY    the device-timed kernel table (benches/kernels.rs, packed as deps/kernels; bargs
#                "--mma-min S" for a setting) over
#                the rows whose names contain one of the comma-separated ONLY
#   ksweep S ONLY  the kernel table's rows ONLY once per kernel setting of the ;-separated S
#                (`default` for the library's defaults)
#   ncuk ONLY RE ncu sections (speed of light, occupancy, warp states, memory, instructions, source
#                counters) over the first 6 launches of the kernels matching the regex RE while the
#                kernel table runs its rows matching ONLY (e.g. ncuk "decode attention" attn_gqa);
#                the Nth ncuk of a call writes ncu_kernelsN.txt.xz; ONLY is split at `|` where
#                it holds one, else at commas (row names hold commas: "…, quantized in-kernel")
#   ncu SETTING  ncu over one engine step at batch 1 after a 1K prompt (kernel durations, CSV)
#   load CLIENTS the OpenAI server under load (examples/loadtest, in-process server, 128-token
#                token-id prompts, 64 tokens out, 2 streaming requests per client per level;
#                load_cCLIENTS.json)
#   ncub B       ncu over one engine step at batch B (each row its own token) after 128-token
#                prompts, on the in-memory weights (kernel durations, CSV)
#   loadc C,ST,PC  load at C clients with the server's step budget ST and prompt pieces of PC
#                (loadtest --step-tokens ST --prefill-chunk PC)
#   mixed C,N,ST,PC  the mixed load: C streaming clients (128-token prompts, 256 out, 3 requests
#                each) while one N-token prompt arrives, under the step budget ST and pieces of PC
#                (loadtest --long-prompt N --step-tokens ST --prefill-chunk PC; 0,0: whole); the
#                streams' inter-token gaps before, during and after its admission
#   bargs ARGS   extra arguments for every later bench and profile step of the call (one word
#                list, e.g. "--shared-expert fold"; "" clears them); ncub's file names carry them
#   ncud SETTING ncu sections (speed of light, occupancy, launch, warp states) over the step's
#                tensor-core, attention, SSM and norm kernels
# Logs go to $OUT (at most 8 files come back: one per step kind).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.device/release
# The CUDA tests of the root crate's one test binary (deps/it), by module.
IT="engine:: slots:: decode_graph:: device_parity:: consistency:: kv8:: fold:: ssm16::"
LT=/tmp/lt
BX=
BT=
wait_lt() { if [ -n "${SYNTH_PID:-}" ]; then wait "$SYNTH_PID"; SYNTH_PID=; fi; }
run() { # log-file command...
  local log=$1; shift
  echo "### $*" | tee -a "$OUT/$log"
  local t0=$SECONDS
  "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  echo "### rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/$log"
  tail -n 4 "$OUT/$log"
}
bench() { wait_lt; run "$@"; }
# The engine on the in-memory weights once per --mma-min setting of the ;-separated $5, median of
# 2: log, prompt lengths, batches, decode steps, settings.
sweep() {
  local sets margs=() s
  IFS=';' read -r -a sets <<<"$5"
  for s in "${sets[@]}"; do margs+=(--mma-min "$s"); done
  run "$1" $B/examples/bench $BX --backend cuda --dtype bf16 --synthetic lightning --seed 0 \
    --engine --graphs on --prompt-len "$2" --batch "$3" --decode "$4" --repeats 2 --no-hf \
    "${margs[@]}"
}
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    unpack) bash tools/device/unpack.sh || exit 1 ;;
    bargs) BX=$1; BT=$(printf %s "$1" | tr -cs 'A-Za-z0-9' _); shift ;;
    # A checkpoint a previous call on this warm machine finished ($LT/.done) is kept.
    synth) [ -f $LT/.done ] || { run synth.log $B/examples/synth --out $LT --geometry lightning \
             --recipe lightning-mixed --text && touch $LT/.done; } ;;
    synth-bg)
      if [ ! -f $LT/.done ]; then
        ( $B/examples/synth --out $LT --geometry lightning --recipe lightning-mixed --text \
            >"$OUT/synth.log" 2>&1 && touch $LT/.done ) &
        SYNTH_PID=$!
      fi ;;
    tests)
      run tests.log $B/deps/ops --ignored --test-threads 1
      run tests.log $B/deps/it --ignored --test-threads 1 $IT
      [ -x $B/deps/memory ] && run tests.log $B/deps/memory --ignored --test-threads 1
      grep -E "^test result|FAILED|panicked" "$OUT/tests.log" | tail -n 20 ;;
    tests-ops)
      IFS=, read -r -a filt <<<"$1"; shift
      run tests.log $B/deps/ops --ignored --test-threads 1 "${filt[@]}"
      run tests.log $B/deps/it --ignored --test-threads 1 $IT
      [ -x $B/deps/memory ] && run tests.log $B/deps/memory --ignored --test-threads 1
      grep -E "^test result|FAILED|panicked" "$OUT/tests.log" | tail -n 20 ;;
    it)
      IFS=, read -r -a filt <<<"$1"; shift
      run tests_it.log $B/deps/it --ignored --test-threads 1 "${filt[@]}"
      grep -E "^test result|FAILED|panicked" "$OUT/tests_it.log" | tail -n 20 ;;
    itenv)
      run tests_env.log env "$1" $B/deps/it --ignored --test-threads 1 $IT
      grep -E "^test result|FAILED|panicked" "$OUT/tests_env.log" | tail -n 20
      shift ;;
    b1) bench engine_b1.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 1024,8192 --batch 1 --decode 64 --repeats 1 --no-hf --mma-min "$1"
        shift ;;
    bN) bench engine_bN.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 128 --batch 16,64 --decode 64 --repeats 1 --no-hf --mma-min "$1"
        shift ;;
    pf) bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 1024,8192 --batch 1 --decode 8 --repeats 2 --no-hf
        bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 128 --batch 16,64 --decode 8 --repeats 2 --no-hf
        bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 12288 --batch 1 --decode 8 --repeats 1 --no-hf ;;
    ops)
      IFS=, read -r -a filt <<<"$1"; shift
      run tests.log $B/deps/ops --ignored --test-threads 1 "${filt[@]}"
      grep -E "^test result|FAILED|panicked" "$OUT/tests.log" | tail -n 20 ;;
    pall) bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 1024 --batch 1,16,64 --decode 64 --repeats 2 --no-hf ;;
    pf3) bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 1024,8192 --batch 1 --decode 8 --repeats 2 --no-hf
        bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 128 --batch 16,64 --decode 8 --repeats 2 --no-hf ;;
    p1) bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 1024,8192 --batch 1 --decode 8 --repeats 2 --no-hf ;;
    pcmp)
        IFS=';' read -r -a sets <<<"$1"; shift
        margs=(); for s in "${sets[@]}"; do margs+=(--mma-min "$s"); done
        bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 1024 --batch 1,16,64 --decode 8 --repeats 2 --no-hf "${margs[@]}" ;;
    p8)
        IFS=';' read -r -a sets <<<"$1"; shift
        margs=(); for s in "${sets[@]}"; do margs+=(--mma-min "$s"); done
        bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 8192 --batch 1 --decode 8 --repeats 2 --no-hf "${margs[@]}" ;;
    pNcmp)
        IFS=';' read -r -a sets <<<"$1"; shift
        margs=(); for s in "${sets[@]}"; do margs+=(--mma-min "$s"); done
        bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 128 --batch 16,64 --decode 8 --repeats 2 --no-hf "${margs[@]}" ;;
    pBcmp)
        IFS=';' read -r -a sets <<<"$1"; shift
        margs=(); for s in "${sets[@]}"; do margs+=(--mma-min "$s"); done
        bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 128 --batch 8,16,64 --decode 8 --repeats 2 --no-hf "${margs[@]}" ;;
    pBs) sweep prefill.log 128 8,16,64 8 "$1"; shift ;;
    b1s) sweep engine_b1.log 1024,8192 1 64 "$1"; shift ;;
    p1s) sweep prefill1.log 1024,8192 1 8 "$1"; shift ;;
    pch)
        IFS=',' read -r st pc <<<"$1"; shift
        run prefill1.log $B/examples/bench $BX --backend cuda --dtype bf16 --synthetic lightning \
          --seed 0 --engine --graphs on --prompt-len 8192 --batch 1 --decode 8 --repeats 2 \
          --no-hf --step-tokens "$st" --prefill-chunk "$pc" ;;
    plong)
        IFS=',' read -r st pc <<<"$1"; shift
        run prefill1.log $B/examples/bench $BX --backend cuda --dtype bf16 --synthetic lightning \
          --seed 0 --engine --graphs on --prompt-len 32768,131072 --batch 1 --decode 8 \
          --repeats 1 --no-hf --step-tokens "$st" --prefill-chunk "$pc" ;;
    bmem)
        run decode.log $B/examples/bench $BX --backend cuda --dtype bf16 --synthetic lightning \
          --seed 0 --engine --graphs on --prompt-len 128 --batch 256 --decode 32 --repeats 2 \
          --no-hf --slot-memory "$1"; shift ;;
    bsweep)
        IFS=';' read -r -a sets <<<"$1"; shift
        margs=(); for s in "${sets[@]}"; do margs+=(--mma-min "$s"); done
        run sweep.log $B/examples/bench $BX --backend cuda --dtype bf16 --synthetic lightning \
          --seed 0 --engine --graphs on --prompt-len 128 --batch 64,256 --decode 32 --repeats 2 \
          --no-hf --slot-memory "${SLOTMEM:-0.3}" "${margs[@]}" ;;
    slotmem) SLOTMEM=$1; shift ;;
    bold)
        # Issue 27's before: bench built at 059cb70^ (packed by hand as examples/bench_before),
        # then this build, on the same checkpoint: decode at 1, 16 and 64 after 128-token
        # prompts, and a 1K prefill.
        for v in _before ""; do
          bench old27.log $B/examples/bench$v --backend cuda --dtype bf16 --model $LT --engine \
            --graphs on --prompt-len 128 --batch 1,16,64 --decode 64 --repeats 2 --no-hf
          bench old27.log $B/examples/bench$v --backend cuda --dtype bf16 --model $LT --engine \
            --graphs on --prompt-len 1024 --batch 1 --decode 8 --repeats 2 --no-hf
        done ;;
    bkv)
        IFS=',' read -r kv fr <<<"$1"; shift
        run decode.log $B/examples/bench $BX --backend cuda --dtype bf16 --synthetic lightning \
          --seed 0 --engine --graphs on --prompt-len 128 --batch 1,64,256 --decode 32 \
          --repeats 2 --no-hf --slot-memory "${fr:-0.3}" --kv-cache-dtype "$kv" ;;
    p16) bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 128 --batch 16,64 --decode 8 --repeats 2 --no-hf ;;
    p16s) run prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --synthetic lightning \
          --seed 0 --engine --graphs on --prompt-len 128 --batch 16,64 --decode 8 --repeats 2 \
          --no-hf ;;
    p12k) bench prefill.log $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --engine \
          --graphs on --prompt-len 12288 --batch 1 --decode 8 --repeats 1 --no-hf ;;
    hfm) wait_lt
        run hf.log python3 tools/hf_bench.py $LT --from-config --device cuda --dtype bfloat16 \
          --runs 1x1024,16x128,64x128 --decode 8 --repeats 1 --mamba-ssm .whl ;;
    pncu) bench ncu_prefill.csv timeout 400 /usr/local/cuda/bin/ncu --clock-control none \
          --metrics gpu__time_duration.sum --csv --print-units base \
          $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --prompt-len 1024 \
          --batch 1 --decode 1 --repeats 1 --no-hf
        xz -f "$OUT/ncu_prefill.csv" ;;
    pncu16) bench ncu_prefill16.csv timeout 400 /usr/local/cuda/bin/ncu --clock-control none \
          --metrics gpu__time_duration.sum --csv --print-units base \
          $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --prompt-len 128 \
          --batch 16 --decode 1 --repeats 1 --no-hf
        xz -f "$OUT/ncu_prefill16.csv" ;;
    pncu64) bench ncu_prefill64.csv timeout 560 /usr/local/cuda/bin/ncu --clock-control none \
          --metrics gpu__time_duration.sum --csv --print-units base \
          $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --prompt-len 128 \
          --batch 64 --decode 1 --repeats 1 --no-hf
        xz -f "$OUT/ncu_prefill64.csv" ;;
    pncup) bench ncu_prefill_b$1.csv timeout 400 /usr/local/cuda/bin/ncu --profile-from-start off \
          --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
          $B/examples/profile $BX --dtype bf16 --model $LT --prompt-len 128 --prefill --batch "$1"
        xz -f "$OUT/ncu_prefill_b$1.csv"; shift ;;
    pncud) bench ncu_prefill_detail.txt timeout 500 /usr/local/cuda/bin/ncu --clock-control none \
          --kernel-name 'regex:tile|mma_kernel|scan_rows|matmul_rows|attn|softmax' --launch-count 14 \
          --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          $B/examples/bench $BX --backend cuda --dtype bf16 --model $LT --prompt-len 128 \
          --batch "$1" --decode 1 --repeats 1 --no-hf
        xz -f "$OUT/ncu_prefill_detail.txt"; shift ;;
    sass) wait_lt
        d=$(mktemp -d); tag=$(echo "$2" | tr -c 'a-z0-9=\n' '_')
        run sass.log env CUBECL_DEBUG_LOG=$d/cubecl_src.log timeout 400 /usr/local/cuda/bin/ncu \
          --profile-from-start off --clock-control none \
          --kernel-name 'regex:fp8_mma_kernel|nvfp4_tile_kernel|fp8_gemm_kernel|fp8_tile_kernel|dense_mma|matmul_rows' \
          --launch-count 8 --section SourceCounters --section InstructionStats --section Occupancy \
          --section LaunchStats --section WarpStateStats --section SpeedOfLight -o $d/rep \
          $B/examples/profile $BX --dtype bf16 --model $LT --prompt-len 128 --prefill --batch "$1" \
          --mma-min "$2"
        /usr/local/cuda/bin/ncu --import $d/rep.ncu-rep --page details >$d/details.txt 2>&1
        /usr/local/cuda/bin/ncu --import $d/rep.ncu-rep --page source --print-source sass --csv \
          >$d/sass.csv 2>&1
        /usr/local/cuda/bin/ncu --import $d/rep.ncu-rep --page source --print-source cuda,sass --csv \
          >$d/cuda_sass.csv 2>&1
        ls -la $d >>"$OUT/sass.log"; head -c 2000 $d/sass.csv >>"$OUT/sass.log"
        tar -C $d -cJf "$OUT/sass_$tag.tar.xz" . ; shift 2 ;;
    kern) run kernels.log $B/deps/kernels $BX --backend cuda --dtype bf16 --only "$1"; shift ;;
    ksweep)
        # The kernel table's rows ONLY ($2) once per setting of the ;-separated S ($1; `default`:
        # the library's defaults), one process each (a setting is process-wide).
        IFS=';' read -r -a sets <<<"$1"
        for s in "${sets[@]}"; do
          if [ "$s" = default ]; then margs=(); else margs=(--mma-min "$s"); fi
          run kernels.log $B/deps/kernels "${margs[@]}" --backend cuda --dtype bf16 --only "$2"
        done
        shift 2 ;;
    ncuk)
        # ncu sections over the first launches of the kernels matching $2 while the kernel
        # table runs its rows matching $1 (no checkpoint, no model: seconds).
        NK=$((${NK:-0} + 1))
        run ncu_kernels$NK.txt timeout 400 /usr/local/cuda/bin/ncu --clock-control none \
          --kernel-name "regex:$2" --launch-count 6 --section SpeedOfLight --section Occupancy \
          --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
          --section InstructionStats --section SourceCounters \
          $B/deps/kernels $BX --backend cuda --dtype bf16 --only "$1"
        xz -f "$OUT/ncu_kernels$NK.txt"; shift 2 ;;
    opsb)
      IFS=, read -r -a filt <<<"$1"; shift
      run tests_broken.log $B/deps/ops_broken --ignored --test-threads 1 "${filt[@]}"
      grep -E "^test result|FAILED|panicked" "$OUT/tests_broken.log" | tail -n 20 ;;
    hf) wait_lt
        run hf.log python3 tools/hf_bench.py $LT --from-config --device cuda --dtype bfloat16 \
          --runs 1x1024,1x8192,16x128,64x128 --decode 8 --repeats 2
        run hf.log python3 tools/hf_bench.py $LT --from-config --device cuda --dtype bfloat16 \
          --runs 1x1024,1x8192,16x128,64x128 --decode 8 --repeats 2 --mamba-ssm .whl ;;
    ncu) bench ncu_b1.csv timeout 300 /usr/local/cuda/bin/ncu --profile-from-start off \
          --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
          $B/examples/profile $BX --dtype bf16 --model $LT --prompt-len 1024 \
          --engine --batch 1 --mma-min "$1"
        xz -f "$OUT/ncu_b1.csv"; shift ;;
    ncub) run "ncu_b$1$BT.csv" timeout 400 /usr/local/cuda/bin/ncu --profile-from-start off \
          --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
          $B/examples/profile $BX --dtype bf16 --synthetic lightning --prompt-len 128 \
          --engine --batch "$1"
        xz -f "$OUT/ncu_b$1$BT.csv"; shift ;;
    load) bench load.log $B/examples/loadtest --model $LT --backend cuda --dtype bf16 \
          --context-length 1024 --clients "$1" --requests 2 --prompt-len 128 --max-tokens 64 \
          --json "$OUT/load_c$1.json"
        shift ;;
    load29)
        # Issue 29's before/after: the server without log-probabilities (a308dbc), with them
        # (b4e2c45), and this build, one after another at C clients (packed by hand as
        # examples/loadtest_before, loadtest_after: see PERF 34).
        for v in _before _after ""; do
          bench load29.log $B/examples/loadtest$v --model $LT --backend cuda --dtype bf16 \
            --context-length 1024 --clients "$1" --requests 4 --prompt-len 128 --max-tokens 64 \
            --json "$OUT/load29_c$1$v.json"
        done
        shift ;;
    loadc)
        IFS=',' read -r cl st pc <<<"$1"; shift
        bench load.log $B/examples/loadtest --model $LT --backend cuda --dtype bf16 \
          --context-length 1024 --clients "$cl" --requests 2 --prompt-len 128 --max-tokens 64 \
          --step-tokens "$st" --prefill-chunk "$pc" --json "$OUT/load_chunked.json" ;;
    mixed)
        IFS=',' read -r cl n st pc <<<"$1"; shift
        bench mixed.log $B/examples/loadtest --model $LT --backend cuda --dtype bf16 \
          --context-length $((n + 1024)) --clients "$cl" --requests 3 --prompt-len 128 \
          --max-tokens 256 --long-prompt "$n" --step-tokens "$st" --prefill-chunk "$pc" \
          --json "$OUT/mixed_${st}_${pc}.json" ;;
    ncud) bench ncu_detail.txt timeout 400 /usr/local/cuda/bin/ncu --profile-from-start off \
          --clock-control none --kernel-name 'regex:mma|attn|ssm_step|add_rms|quantize' \
          --launch-count 40 --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section WarpStateStats --section ComputeWorkloadAnalysis \
          $B/examples/profile $BX --dtype bf16 --model $LT --prompt-len 1024 \
          --engine --batch 1 --mma-min "$1"
        xz -f "$OUT/ncu_detail.txt"; shift ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
wait
