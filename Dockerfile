# The poolkeeper image: `poolkeeper operator` for the Helm chart, any other command too.
#   docker build -t poolkeeper:0.1.0 .
# Dependencies are installed at the versions pinned in constraints.txt.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/poolkeeper
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY controller ./controller
RUN /opt/poolkeeper/bin/pip install --no-compile -c constraints.txt . \
    && /opt/poolkeeper/bin/python -m compileall -q /opt/poolkeeper/lib

FROM python:3.11-slim-bookworm
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
