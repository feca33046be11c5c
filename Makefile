# Shortcuts for ./dev, which is what the README and CI use (a fresh Debian has no make).
.PHONY: run test test-fast bench
run test test-fast bench:
	./dev $@
