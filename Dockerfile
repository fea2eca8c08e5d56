# The poolkeeper image: `poolkeeper operator` for the Helm chart, any other command too.
#   docker build -t poolkeeper:0.1.0 .       (or podman build; `make image` builds it here)
# Dependencies are installed at the versions pinned in constraints.txt.
#
# BASE: any Debian-like image with Python 3.11 as `python3` (with its venv module),
# coreutils and groupadd/useradd. `make image` (scripts/build-image.sh) makes one with
# debootstrap where the public image cannot be pulled.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
# The CA bundle pip trusts, where it must be told (a path mounted into the build).
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/poolkeeper
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY controller ./controller
RUN /opt/poolkeeper/bin/pip install --no-compile -c constraints.txt . \
    && /opt/poolkeeper/bin/python -m compileall -q /opt/poolkeeper/lib

FROM ${BASE}
ENV PATH=/opt/poolkeeper/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A fixed numeric UID/GID with a passwd entry; the chart runs as 10001:10001.
RUN groupadd --gid 10001 poolkeeper \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin poolkeeper
COPY --from=build /opt/poolkeeper /opt/poolkeeper
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["poolkeeper"]
CMD ["operator"]
