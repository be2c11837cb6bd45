# shellcheck shell=bash
# tiny runs on the CPU of any machine (see tiny.yml).
export JAX_PLATFORMS=cpu
