// Package faults runs warden's fenced-counter workload in real processes,
// under injected faults, for every backend: worker processes loop on
// guard.Guard.Do over one key, and inside the section read a counter from a
// fenced store owned by the test process and write it back incremented,
// twice, with the lock's fencing token. The store refuses a write carrying a
// token below the highest it accepted (or that token from another section),
// and keeps every read and write with the section's interval, from which the
// test judges that the counter lost no increment, that no two sections
// whose writes were accepted overlapped, that tokens only grew, that the
// lock came back within the TTL and a second after each fault, that nothing
// was left on the backend, and that every worker exited when told to.
//
// The faults are kill -9 and SIGSTOP (past the TTL, then SIGCONT) of the
// holder inside its section; a partition of one worker by a TCP proxy that
// blackholes, then resets; crashes and restarts, and outages longer than the
// TTL, of servers the suite starts itself; and RedLock with two, then three,
// of five masters down. Faults that touch no server run on the shared
// servers of scripts/services.sh (WARDEN_* variables), under keys, nodes and
// tables of their own; the servers a fault stops are the suite's own, on
// ports 17181, 17379-17385, 17432, 17479-17480 and 17500-17502 (etcd and a
// Consul server of one from the binaries scripts/services.sh builds once
// into its cache), with their data in temporary directories. The shared
// servers are never stopped.
//
// Consul rows lease for 10 s, the shortest session TTL Consul accepts, and
// are judged by twice that: a Consul leader invalidates a session that is
// no longer renewed twice its TTL after the last renewal, so that is when
// the lock of a killed, stopped or cut-off holder comes back. A restart of
// a Consul server keeps its data; a restart of a dev agent, which keeps
// nothing, is a row of its own (see injectWipe).
//
// Everything is in test files behind the build tag faults, so that go test
// ./... passes over it:
//
//	eval "$(scripts/services.sh env)"
//	WARDEN_REQUIRE_SERVERS=1 go test -tags faults -count=1 -timeout 20m -v ./internal/faults/
//
// The table of figures is printed at the end (shown by go test with -v, or
// on failure), and written to the file WARDEN_FAULTS_TABLE names. A failed
// scenario keeps the store's history and the workers' logs in a file it
// names. WARDEN_FAULTS_LOSSY=1 adds a scenario on a PostgreSQL that loses
// committed transactions when it crashes (synchronous_commit=off), to show
// what that does to tokens.
package faults
