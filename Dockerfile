# Training image: MaxText 0.2.5 on a GPU JAX base image, used by _container.sh.
#   podman build -t localhost/maxtext-slurm:latest .                       # NVIDIA (default base)
#   podman build --build-arg BASE_IMAGE=docker.io/rocm/jax:latest -t localhost/maxtext-slurm:latest .   # AMD
# The base image brings Python >= 3.12 and a GPU build of jax/jaxlib; KEEP_BASE_JAX=1 (default)
# keeps that build instead of the CPU jaxlib pinned in requirements/maxtext.txt. For a CPU-only
# image use a python:3.12 base and --build-arg KEEP_BASE_JAX=0. Prometheus (for RAY=1) comes from
# the base distribution's packages where it has apt.
ARG BASE_IMAGE=nvcr.io/nvidia/jax:25.10-py3
FROM ${BASE_IMAGE}
ARG KEEP_BASE_JAX=1
WORKDIR /opt/maxtext-slurm
COPY requirements/ requirements/
RUN set -eux; \
    python3 -c 'import sys; assert sys.version_info >= (3, 12), "MaxText 0.2.5 needs Python >= 3.12"'; \
    reqs=requirements/maxtext.txt; \
    if [ "$KEEP_BASE_JAX" = 1 ]; then grep -vE '^(jax|jaxlib)==' "$reqs" > /tmp/maxtext.txt; reqs=/tmp/maxtext.txt; fi; \
    python3 -m pip install --no-cache-dir --no-deps -r "$reqs"; \
    grep -vE '^(jax|jaxlib)==' requirements/constraints.txt > /tmp/constraints.txt; \
    python3 -m pip install --no-cache-dir -r requirements/tools.txt -c /tmp/constraints.txt; \
    python3 -c 'import maxtext, jax; print("maxtext ok, jax", jax.__version__)'; \
    if command -v apt-get >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends prometheus procps iproute2 && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PYTHONUNBUFFERED=1
