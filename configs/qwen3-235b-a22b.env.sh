# shellcheck shell=bash
# Environment for qwen3-235b-a22b.yml, sourced by the training tier after the launcher's defaults
# (only export lines and comments; a site's NCCL/RCCL network settings belong to the cluster
# setup, not here). Every XLA flag below exists in jaxlib 0.12: tests/test_configs.py starts
# XLA with them, and XLA aborts on an unknown flag or a malformed value.
#   --xla_gpu_enable_latency_hiding_scheduler  schedule collectives to overlap with compute
#   --xla_gpu_*_combine_threshold_bytes        merge the many small per-layer FSDP collectives
#                                              into fewer NCCL/RCCL calls of up to 128 MiB
#   --xla_gpu_pipeline_*=on                    start the next scanned layer's collectives
#                                              during the current layer
#   --xla_gpu_enable_triton_gemm=false         matmuls on cuBLAS/hipBLASLt: shorter compiles,
#                                              no Triton autotuning
export XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_all_gather_combine_threshold_bytes=134217728 --xla_gpu_reduce_scatter_combine_threshold_bytes=134217728 --xla_gpu_all_reduce_combine_threshold_bytes=134217728 --xla_gpu_pipeline_all_gather=on --xla_gpu_pipeline_reduce_scatter=on --xla_gpu_pipeline_all_reduce=on --xla_gpu_enable_triton_gemm=false"
