.PHONY: serve test test-heavy lint bench
serve:   ## start the server on the default models (converting them if needed)
	scripts/serve.sh
test:    ## run the whole test suite (installs what it needs)
	scripts/test.sh
test-heavy:  ## the long reliability tests (fuzz, soak, overload)
	scripts/test.sh -m heavy
lint:    ## ruff and mypy alone (make test runs them too, in tests/test_lint.py)
	scripts/test.sh tests/test_lint.py
bench:
	scripts/bootstrap.sh convert,test && .venv/bin/python -m bench all
