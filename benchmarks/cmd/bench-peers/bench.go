package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// servers is where the servers are, from the variables scripts/services.sh
// env prints.
type servers struct {
	redis    string
	redlock  []string
	etcd     []string
	zk       []string
	postgres string
	consul   string
}

func serversFromEnv() servers {
	get := func(name, def string) string {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" {
			return v
		}
		return def
	}
	list := func(v string) []string {
		var out []string
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		return out
	}
	return servers{
		redis:    get("WARDEN_REDIS_ADDR", "127.0.0.1:16379"),
		redlock:  list(get("WARDEN_REDLOCK_ADDRS", "127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384")),
		etcd:     list(get("WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379")),
		zk:       list(get("WARDEN_ZK_SERVERS", "127.0.0.1:12181")),
		postgres: get("WARDEN_POSTGRES_DSN", "postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable"),
		consul:   get("WARDEN_CONSUL_ADDR", "127.0.0.1:18500"),
	}
}

// pair is a warden subject set against a peer: every figure of the report is
// one of these, warden's beside the peer's from the same run.
type pair struct {
	group  string
	warden string // subject ids
	peer   string
	// contendedOnly: the pair differs from another only under contention
	// (fair mode), so the other scenarios would measure nothing new.
	contendedOnly bool
	// target is the throughput ratio warden must reach against this peer;
	// 1 unless the peer is a hand-written floor that does less.
	target float64
}

// peerPairs sets warden against a peer at its documented settings and,
// where the peer has a retry pause to tune, against its tuned variant too:
// the worse of the two ratios is the one that counts.
func peerPairs(p pair, tunable bool) []pair {
	if p.target == 0 {
		p.target = 1
	}
	if !tunable {
		return []pair{p}
	}
	t := p
	t.peer = tunedID(p.peer)
	return []pair{p, t}
}

var pairs = slices.Concat(
	peerPairs(pair{group: "redis", warden: "warden-redis", peer: "bsm"}, true),
	peerPairs(pair{group: "redis", warden: "warden-redis", peer: "redsync"}, true),
	peerPairs(pair{group: "redis", warden: "warden-redis", peer: "raw-redis", target: 0.95}, true),
	peerPairs(pair{group: "redis", warden: "warden-redis-fair", peer: "bsm", contendedOnly: true}, true),
	peerPairs(pair{group: "redlock", warden: "warden-redlock", peer: "redsync5"}, true),
	peerPairs(pair{group: "etcd", warden: "warden-etcd", peer: "etcd-mutex"}, false),
	peerPairs(pair{group: "zk", warden: "warden-zk", peer: "zk-lock"}, false),
	peerPairs(pair{group: "postgres", warden: "warden-pg", peer: "raw-pg", target: 0.9}, true),
	peerPairs(pair{group: "consul", warden: "warden-consul", peer: "consul-lock"}, true),
	peerPairs(pair{group: "consul", warden: "warden-consul", peer: "consul-semaphore"}, true),
	peerPairs(pair{group: "memory", warden: "warden-memory", peer: "sync-mutex"}, false),
)

// bench is one run, or one group's process in a run: its settings, its
// subjects, and the figures so far.
type bench struct {
	s   settings
	log io.Writer
	id  string // names this process's keys, so runs sharing servers stay apart
	srv servers
	// groups are the groups measured: a group's process's own, once its
	// servers answered; in the parent, those whose process handed off its
	// figures.
	groups  []string
	skipped map[string]string // group: why it was left out
	subj    map[string]*subject
	admin   *admin
	// consulSrc gives each Consul client a source address of its own.
	consulSrc consulSources
	tables    []tableState // PostgreSQL lock tables, as they were at each phase
	machine   machine
	res       *results
	start     time.Time
	end       time.Time
}

// newBench makes a run's bench, with every subject; it asks no server
// anything yet.
func newBench(s settings, log io.Writer) (*bench, error) {
	var idb [4]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, err
	}
	b := &bench{
		s:       s,
		log:     log,
		id:      hex.EncodeToString(idb[:]),
		srv:     serversFromEnv(),
		skipped: map[string]string{},
		subj:    map[string]*subject{},
		admin:   newAdmin(),
		res:     newResults(),
		machine: describeMachine(),
	}
	for _, sub := range allSubjects(b) {
		b.subj[sub.id] = sub
	}
	return b, nil
}

// connect prepares the servers of the one group a process measures.
func (b *bench) connect(ctx context.Context, group string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	version, err := b.prepare(ctx, group)
	if err != nil {
		return err
	}
	if version != "" {
		b.machine.servers = append(b.machine.servers, version)
	}
	b.groups = []string{group}
	return nil
}

// prepare checks that a group's servers answer, creates what its subjects
// need on them, and returns the servers' versions for the report.
func (b *bench) prepare(ctx context.Context, group string) (string, error) {
	switch group {
	case "redis":
		return b.admin.prepareRedis(ctx, []string{b.srv.redis}, "Redis")
	case "redlock":
		if len(b.srv.redlock) < 3 {
			return "", fmt.Errorf("RedLock needs at least 3 servers, WARDEN_REDLOCK_ADDRS has %d", len(b.srv.redlock))
		}
		return b.admin.prepareRedis(ctx, b.srv.redlock, fmt.Sprintf("RedLock: %d × Redis", len(b.srv.redlock)))
	case "etcd":
		return etcdVersion(ctx, b.srv.etcd)
	case "zk":
		return zkVersion(ctx, b.srv.zk)
	case "postgres":
		return preparePostgres(ctx, b.srv.postgres)
	case "consul":
		return consulVersion(ctx, b.srv.consul)
	}
	return "", nil
}

// keyFor names the lock of one measurement. Every measurement has a lock of
// its own, so none inherits a queue, a waiter or a lease from an earlier one.
func (b *bench) keyFor(scenario, subject string, n, rep, try int) string {
	return fmt.Sprintf("bench-peers/%s/%s-%d/%s/r%d.%d", b.id, scenario, n, subject, rep, try)
}

// selected lists the pairs of the groups being measured, for a scenario.
func (b *bench) selected(scenario string) []pair {
	var out []pair
	for _, p := range pairs {
		if !slices.Contains(b.groups, p.group) {
			continue
		}
		if p.contendedOnly && scenario != "contended" {
			continue
		}
		if scenario == "renewal" && (b.subj[p.warden].holder == nil || b.subj[p.peer].holder == nil) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// subjectsFor lists, once each and in a fixed order, the subjects of the
// pairs measured in scenario.
func (b *bench) subjectsFor(scenario string) []*subject {
	var out []*subject
	seen := map[string]bool{}
	for _, p := range b.selected(scenario) {
		for _, id := range []string{p.warden, p.peer} {
			if !seen[id] {
				seen[id] = true
				out = append(out, b.subj[id])
			}
		}
	}
	return out
}

// rotate starts the list at rep, so that no subject always runs first in a
// repetition, on a machine that is warming up, or always after the same
// neighbour.
func rotate[T any](list []T, rep int) []T {
	if len(list) == 0 {
		return list
	}
	k := rep % len(list)
	return append(append([]T(nil), list[k:]...), list[:k]...)
}

// measureAll runs every repetition of every measurement. Repetitions are
// the outer loop, so that a slow drift of the machine's load touches every
// subject alike rather than all repetitions of one.
func (b *bench) measureAll(ctx context.Context) error {
	b.start = time.Now()
	fmt.Fprintf(b.log, "bench-peers run %s: groups %s, %d repetition(s)\n", b.id, strings.Join(b.groups, ","), b.s.reps)
	if err := b.agePostgres(ctx); err != nil {
		return err
	}
	for rep := 0; rep < b.s.reps; rep++ {
		if slices.Contains(b.s.scenarios, "uncontended") {
			subs, rs, err := b.uncontended(ctx, rotate(b.subjectsFor("uncontended"), rep), rep)
			if err != nil {
				return err
			}
			for i, sub := range subs {
				fmt.Fprintf(b.log, "rep %d uncontended  %-26s %s\n", rep+1, sub.label, rs[i])
				b.res.addCycle(cycleKey{"uncontended", 1, 0, sub.id}, rs[i])
			}
		}
		if slices.Contains(b.s.scenarios, "contended") {
			for _, n := range b.s.contenders {
				for _, hold := range b.s.holds {
					for _, sub := range rotate(b.subjectsFor("contended"), rep) {
						err := b.attempts(ctx, "contended", sub, n, rep, func(try int) (bool, error) {
							r, err := b.contended(ctx, sub, n, hold, rep, try)
							if err == nil {
								fmt.Fprintf(b.log, "rep %d contended %-3d hold %-5v %-34s %s\n", rep+1, n, hold, sub.label, r)
								if !r.foreign || try == lastTry {
									b.res.addCycle(cycleKey{"contended", n, hold, sub.id}, r)
								}
							}
							return r.foreign, err
						})
						if err != nil {
							return err
						}
					}
				}
			}
		}
		if slices.Contains(b.s.scenarios, "renewal") {
			for _, n := range b.s.sizes {
				for _, sub := range rotate(b.subjectsFor("renewal"), rep) {
					if sub.maxLocks > 0 && n > sub.maxLocks {
						continue
					}
					err := b.attempts(ctx, "renewal", sub, n, rep, func(try int) (bool, error) {
						r, err := b.renewal(ctx, sub, n, rep, try)
						if err == nil {
							fmt.Fprintf(b.log, "rep %d renewal %-5d %-26s %s\n", rep+1, n, sub.label, r)
							if !r.foreign || try == lastTry {
								b.res.addRenewal(n, sub.id, r)
							}
						}
						return r.foreign, err
					})
					if err != nil {
						return err
					}
				}
			}
		}
		if slices.Contains(b.s.scenarios, "idempotency") {
			for _, st := range b.idemStores() {
				if !slices.Contains(b.groups, st.group) {
					continue
				}
				rs, err := b.idempotent(ctx, st, rep)
				if err != nil {
					if err := b.noteFailure(ctx, err, fmt.Sprintf("idempotency, %s, repetition %d", st.label, rep+1)); err != nil {
						return err
					}
					continue
				}
				for _, phase := range idemPhases {
					fmt.Fprintf(b.log, "rep %d idempotency %-6s %-28s %s\n", rep+1, phase, st.label, rs[phase])
					k := idemKey{st.label, phase}
					b.res.idem[k] = append(b.res.idem[k], rs[phase])
				}
			}
		}
	}
	b.end = time.Now()
	if slices.Contains(b.groups, "postgres") {
		b.notePGTables(ctx, "end of the run")
	}
	fmt.Fprintf(b.log, "measured in %v\n", b.end.Sub(b.start).Round(time.Second))
	return nil
}

// lastTry is the last attempt at a measurement that another client's
// commands spoilt: the servers are shared, and such traffic comes in bursts,
// so a measurement is taken again up to twice before its result is kept
// with the mark that says so.
const lastTry = 2

// attempts runs one measurement until it is not spoilt by another client's
// commands, or lastTry. A failed measurement is noted and the run goes on
// without it, unless the run itself was interrupted.
func (b *bench) attempts(ctx context.Context, scenario string, sub *subject, n, rep int, f func(try int) (foreign bool, err error)) error {
	for try := 0; try <= lastTry; try++ {
		foreign, err := f(try)
		if err != nil {
			return b.note(ctx, err, scenario, sub, n, rep)
		}
		if !foreign {
			return nil
		}
		if try < lastTry {
			b.res.retries++
			fmt.Fprintf(b.log, "  another client used the server meanwhile: measuring again\n")
		}
	}
	return nil
}

// note records a measurement that failed. The run goes on without it (the
// report says which failed and why) unless the run itself was interrupted.
func (b *bench) note(ctx context.Context, err error, scenario string, sub *subject, n, rep int) error {
	if err == nil {
		return nil
	}
	return b.noteFailure(ctx, err, fmt.Sprintf("%s %d, %s, repetition %d", scenario, n, sub.label, rep+1))
}

// noteFailure records a failed measurement, named by what.
func (b *bench) noteFailure(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	msg := fmt.Sprintf("%s: %v", what, err)
	b.res.failures = append(b.res.failures, msg)
	fmt.Fprintln(b.log, "FAILED", msg)
	return nil
}

// close removes what this run left on the servers and closes the admin
// clients.
func (b *bench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := "bench-peers/" + b.id + "/"
	if slices.Contains(b.groups, "redis") {
		b.admin.deleteKeys(ctx, []string{b.srv.redis}, prefix)
	}
	if slices.Contains(b.groups, "redlock") {
		b.admin.deleteKeys(ctx, b.srv.redlock, prefix)
	}
	if slices.Contains(b.groups, "postgres") {
		cleanPostgres(ctx, b.srv.postgres, prefix)
	}
	if slices.Contains(b.groups, "zk") {
		cleanZK(b.srv.zk, b.id)
	}
	if slices.Contains(b.groups, "consul") {
		cleanConsul(ctx, b.srv.consul, b.id)
	}
	b.admin.close()
}
