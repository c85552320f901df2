# Redis and HAProxy from Debian's packages, on the same base image as Sluice's, so that
# the stack builds where no registry is reachable (compose: the redis and proxy services).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      redis-server haproxy >/dev/null \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* \
 && mkdir -p /data && chown redis:redis /data
COPY compose/haproxy.cfg /etc/haproxy/haproxy.cfg
