# The two commands of the quick start: `make run` and `make test`.
# Each installs what it needs (a virtualenv in .venv, test peers in .peers).

PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test check install peers clean

# .venv/bin first on PATH: it holds the claude CLI from the claude-agent-sdk wheel.
run: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/chatbridge run $(if $(CONFIG),--config $(CONFIG))

test:
	bash scripts/test.sh

check: $(STAMP)
	bash scripts/check.sh

install: $(STAMP)

$(STAMP): pyproject.toml
	bash scripts/install.sh
	@touch $@

peers:
	bash scripts/install-peers.sh

clean:
	rm -rf $(VENV) .peers .mypy_cache .ruff_cache .pytest_cache
