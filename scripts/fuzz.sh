#!/usr/bin/env bash
# Runs every fuzz target in the module for a short while: FUZZTIME each
# (default 10s), FUZZ (a regexp, default all) choosing which.
#
# `go test -fuzz` takes one target in one package per run, hence the loop.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
FUZZ=${FUZZ:-.}

ran=0
while IFS= read -r file; do
	dir=./$(dirname "$file")
	while IFS= read -r target; do
		[[ $target =~ $FUZZ ]] || continue
		echo "== $dir $target ($FUZZTIME)"
		"$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$dir"
		ran=$((ran + 1))
	done < <(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/p' "$file")
done < <(git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go' -not -path './.git/*' | sed 's|^\./||')

if [[ $ran -eq 0 ]]; then
	echo "fuzz: no fuzz targets matching '$FUZZ'"
fi
