# meshscale on NVIDIA's NGC PyTorch image: CUDA, cuDNN, NCCL and PyTorch come from the image (the host only
# needs the driver and the NVIDIA container toolkit). Build and run:
#   docker build -t meshscale .                       # or --build-arg NGC_TAG=<a newer tag>
#   docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
#       -v "$PWD/out:/out" meshscale meshscale tour --output /out/tour
# --ipc=host (or --shm-size=1g) avoids the 64 MiB /dev/shm trap, --ulimit memlock=-1 lets NCCL pin buffers
# for InfiniBand/RDMA; `meshscale doctor` checks both.
ARG NGC_TAG=25.10-py3
FROM nvcr.io/nvidia/pytorch:${NGC_TAG}

# NCCL safety knobs (the same ones meshscale.execute.launch sets): no NVLink SHARP / multicast, which the
# shared machines meshscale is tested on do not allow.
ENV NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 \
    PYTHONUNBUFFERED=1 \
    MPLBACKEND=Agg

WORKDIR /opt/meshscale
COPY pyproject.toml README.md ./
COPY src ./src
# meshscale's own dependencies except torch (the image's CUDA build must stay; pip keeps what is already
# installed, numpy included), then meshscale itself with --no-deps.
RUN pip install --no-cache-dir numpy "networkx>=3" "scipy>=1.10" nvidia-ml-py "typer>=0.12" rich pyyaml matplotlib jinja2 \
 && pip install --no-cache-dir --no-deps . \
 && meshscale --help > /dev/null

WORKDIR /workspace
CMD ["meshscale", "doctor"]
