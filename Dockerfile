# The kf image: `kf worker` and the one-shot `kf up` of docker-compose.yml.
#   docker build -t kernel-factory .
#   docker run --rm -e KF_DATABASE_URL=... -e KF_TEMPORAL_ADDRESS=... kernel-factory worker
FROM python:3.11-slim

# A C compiler: the CPU backend compiles candidate kernels on the worker. libseccomp2: the sandboxed worker
# confines itself with a seccomp filter (pyseccomp loads it) before loading a candidate.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libseccomp2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . /app
# Editable, so engine/ finds migrations/ and kernels/ next to it, as in a checkout.
RUN pip install --no-cache-dir -e .

# Not root: candidate kernels run in child processes of the worker, under this user's limits.
RUN useradd --create-home --uid 1000 kf && chown -R kf /app
USER kf
ENV KF_HOME=/home/kf/.kf \
    PYTHONUNBUFFERED=1

ENTRYPOINT ["kf"]
CMD ["worker"]
