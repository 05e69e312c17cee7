.PHONY: serve test test-heavy lint bench images test-container
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
images:  ## build both CPU images and the GPU image with podman, no registry (root on Debian; docs/deployment.md)
	scripts/images.sh all
test-container:  ## run the baked CPU image as an edge site would (root, podman); builds the image if missing
	(command -v podman >/dev/null && podman image exists localhost/edge-runtime:cpu-defaults) || scripts/images.sh cpu-defaults
	scripts/test.sh -m container tests/test_container.py
