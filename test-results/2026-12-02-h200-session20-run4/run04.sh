#!/usr/bin/env bash
# Session 20 run 4 (three device calls on the warm machine; build 60072f7, tree 9bd6b3e, the harness
# still rotating the order): a, every implementation at the five shapes; b, gemma2-2b with every
# implementation twice; c, gemma2-2b with cuBLAS, eager and torch.compile beside lfce's recompute,
# beside Liger-Kernel, and alone.
bash .device/run.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so; R=$OUT/r; mkdir -p $R
IMPLS=cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile,torch,liger
timeout 380 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls $IMPLS --iters 10 --warmup 3 --profile-steps 0 --wheels .device/wheels --out $R/bench > $R/all-rotated.log 2>&1
for i in 1 2; do timeout 150 python3 -m lfce.bench --models gemma2-2b:8192 --impls $IMPLS --iters 15 --warmup 3 --profile-steps 0 --wheels .device/wheels --out $R/gemma-all-$i > $R/gemma-all-$i.log 2>&1; done
i=0; for im in cublas_3gemm,lfce_eager,torch_compile,lfce_recompute cublas_3gemm,lfce_eager,torch_compile,liger cublas_3gemm,lfce_eager,torch_compile; do
  i=$((i+1)); timeout 100 python3 -m lfce.bench --models gemma2-2b:8192 --impls $im --iters 15 --warmup 3 --profile-steps 0 --wheels .device/wheels --out $R/n$i > $R/gemma-neighbour-$i.log 2>&1
done
