# The kvgate image: one image for every kvgate process (control plane, ext_proc, emulator).
#   docker build -t kvgate:0.1.0 .
# Envoy runs from the official envoyproxy/envoy image; etcd from quay.io/coreos/etcd.
FROM python:3.11-slim AS build
WORKDIR /src
# .dockerignore lets only the package sources, pyproject.toml and README.md in.
COPY . .
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 kvgate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvgate
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The config is mounted here (compose volume, Kubernetes ConfigMap).
WORKDIR /tmp
USER 10001:10001
# Every process is `kvgate SUBCOMMAND ...`; compose and Kubernetes give the full command.
CMD ["kvgate", "--help"]
