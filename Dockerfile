# ldpstream worker / fleet image: `docker build -t ldpstream .`, then
# `docker run ldpstream worker` or `docker run ldpstream fleet` (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY ldpstream ./ldpstream
COPY estimators ./estimators
COPY producers ./producers
COPY agents ./agents
COPY bench ./bench
RUN pip install . && rm -rf /src/build

# unprivileged user; faust keeps its local data directory in the working directory
# /keys: volumes for the ldp.config signing key pair (docker-compose.yml `keygen`) start owned by ldp;
# /certs: the Kafka CA and broker certificate (`kafka-certs`), likewise
RUN useradd --create-home --uid 10001 ldp && mkdir -p /data /keys/private /keys/public /certs \
    && chown -R ldp:ldp /data /keys /certs
USER ldp
WORKDIR /data

EXPOSE 6066
ENTRYPOINT ["ldpstream"]
CMD ["worker", "--web-port", "6066"]
