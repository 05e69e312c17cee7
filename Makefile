.PHONY: serve test test-heavy lint bench images test-container arm64-userland
serve:   ## start the server on the default models (converting them if needed)
	scripts/serve.sh
test:    ## run the whole test suite (installs what it needs)
	scripts/test.sh
test-heavy:  ## the long reliability tests (fuzz, soak, overload) and every emulated ARM CPU class
	([ "$$(id -u)" = 0 ] && scripts/arm64_userland.sh) || echo "no aarch64 userland: the ARM classes will be skipped" >&2
	scripts/test.sh -m heavy
arm64-userland:  ## the aarch64 userland the ARM CPU-class checks run in (root, about 5 minutes; scripts/arm64_userland.sh)
	scripts/arm64_userland.sh
lint:    ## ruff and mypy alone (make test runs them too, in tests/test_lint.py)
	scripts/test.sh tests/test_lint.py
bench:
	scripts/bootstrap.sh convert,test && .venv/bin/python -m bench all
images:  ## build both CPU images for amd64 and arm64 (emulated) and the GPU image with podman, no registry (root on Debian; ARCHES=amd64 for one; docs/deployment.md)
	scripts/images.sh all
test-container:  ## run the baked CPU images as an edge site would (root, podman; arm64 under emulation where qemu registers); builds them if missing
	(command -v podman >/dev/null && podman image exists localhost/edge-runtime:cpu-defaults) || scripts/images.sh cpu-defaults
	(command -v podman >/dev/null && podman image exists localhost/edge-runtime:cpu-defaults-arm64) \
	    || ! scripts/qemu_binfmt.sh || scripts/images.sh cpu-defaults-arm64
	scripts/test.sh -m container tests/test_container.py
