# Thin wrappers; the logic lives in deploy/dev (see docs/operators.md).
.PHONY: run test

run:
	bash deploy/dev up

# make test ARGS="-k lease -x"
test:
	bash deploy/dev test $(ARGS)
