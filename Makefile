.PHONY: serve test test-heavy bench
serve:   ## start the server on the default models (converting them if needed)
	scripts/serve.sh
test:    ## run the whole test suite (installs what it needs)
	scripts/test.sh
test-heavy:  ## the long reliability tests (fuzz, soak, overload)
	scripts/test.sh -m heavy
bench:
	scripts/bootstrap.sh convert,test && .venv/bin/python -m bench all
