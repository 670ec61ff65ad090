package zklock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

// testStoreRoot keeps the stores' records apart from the locks' and from
// anything else on the server.
const testStoreRoot = "/warden-test/idem"

// connect returns a connection of its own, closed at the end of the test.
// Connection errors are expected in the fault tests, so the client library's
// log is dropped.
func connect(t testing.TB, addrs []string) *zk.Conn {
	t.Helper()
	conn, _, err := zk.Connect(addrs, 10*time.Second, zk.WithLogger(discard{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatalf("zk.Connect: %v", err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// newTestStore returns a store on a connection of its own, as a separate
// process would have.
func newTestStore(t testing.TB, addrs []string, opts ...StoreOption) *Store {
	t.Helper()
	s, err := NewStore(connect(t, addrs), append([]StoreOption{WithStoreRoot(testStoreRoot)}, opts...)...)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return s
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// deadAddr is an address nothing listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// waitFor polls cond every interval until it holds or a generous deadline
// passes.
func waitFor(t testing.TB, what string, interval time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(interval)
	}
}

// TestStoreConformance runs the store suite on the shared server, then purges
// the records it left whose lease or retention has run out, so that repeated
// runs do not pile them up.
func TestStoreConformance(t *testing.T) {
	srv := servers(t)
	storetest.Run(t, func(t testing.TB) idempotency.Store { return newTestStore(t, srv) })
	if _, err := newTestStore(t, srv).Purge(testCtx(t)); err != nil {
		t.Errorf("Purge: %v", err)
	}
}

// TestIdempotencyMiddleware runs httpmw's behaviour tests, over real HTTP, on
// the ZooKeeper store: the middleware's guarantees are only as good as the
// store under it.
func TestIdempotencyMiddleware(t *testing.T) {
	srv := servers(t)
	httpmwtest.Run(t, func(t testing.TB) idempotency.Store { return newTestStore(t, srv) })
}

// TestStoreOptions needs no server: options are checked before any request.
func TestStoreOptions(t *testing.T) {
	conn := connect(t, []string{deadAddr(t)})
	bad := func(what string, err error, mention string) {
		t.Helper()
		if !errors.Is(err, idempotency.ErrInvalid) || !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalid and ErrInvalidOption", what, err)
		} else if !strings.Contains(err.Error(), mention) {
			t.Errorf("%s: %q does not name the problem (%q)", what, err, mention)
		}
	}
	_, err := NewStore(nil)
	bad("nil conn", err, "nil *zk.Conn")
	for _, c := range []struct {
		what    string
		opt     StoreOption
		mention string
	}{
		{"empty root", WithStoreRoot(""), "root"},
		{"root /", WithStoreRoot("/"), "root"},
		{"relative root", WithStoreRoot("warden/idem"), "root"},
		{"trailing slash", WithStoreRoot("/warden/idem/"), "root"},
		{"doubled slash", WithStoreRoot("/warden//idem"), "root"},
		// Paths ZooKeeper refuses, which would fail every request.
		{"dot-dot element", WithStoreRoot("/warden/../idem"), "root"},
		{"dot element", WithStoreRoot("/warden/./idem"), "root"},
		{"NUL", WithStoreRoot("/warden/i\x00dem"), "root"},
		{"control character", WithStoreRoot("/warden/i\x01dem"), "root"},
		{"not UTF-8", WithStoreRoot("/warden/i\xffdem"), "root"},
		{"empty ACL", WithStoreACL(), "ACL"},
		{"ACL granting create without delete", WithStoreACL(zk.ACL{Perms: zk.PermCreate | zk.PermRead | zk.PermWrite, Scheme: "world", ID: "anyone"}), "without delete"},
		{"digest ACL granting create without delete", WithStoreACL(zk.DigestACL(zk.PermCreate|zk.PermRead, "user", "secret")...), `digest user "user" is granted create without delete`},
		{"zero timeout", WithStoreRequestTimeout(0), "timeout"},
		{"negative timeout", WithStoreRequestTimeout(-time.Second), "timeout"},
		{"nil option", nil, "nil option"},
	} {
		s, err := NewStore(conn, c.opt)
		if s != nil {
			t.Errorf("%s: got a store", c.what)
		}
		bad(c.what, err, c.mention)
		if err != nil && (shownHash(err, zk.DigestACL(0, "user", "secret")) != "" || strings.Contains(err.Error(), "Locker")) {
			t.Errorf("%s: %v shows the digest hash, or speaks of a Locker", c.what, err)
		}
	}

	acl := zk.DigestACL(zk.PermAll, "user", "password")
	s, err := NewStore(conn, WithStoreRoot("/app/idem"), WithStoreACL(acl...), WithStoreRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if s.root != "/app/idem" || len(s.acl) != 1 || s.acl[0] != acl[0] || s.timeout != time.Second {
		t.Errorf("options not applied: root %q, acl %v, timeout %v", s.root, s.acl, s.timeout)
	}
	s, err = NewStore(conn)
	if err != nil {
		t.Fatal(err)
	}
	if s.root != DefaultStoreRoot || s.timeout != DefaultStoreRequestTimeout {
		t.Errorf("defaults: root %q, timeout %v", s.root, s.timeout)
	}
	// Create and delete granted to one identity by two entries.
	split := []zk.ACL{{Perms: zk.PermCreate | zk.PermRead, Scheme: "world", ID: "anyone"}, {Perms: zk.PermDelete, Scheme: "world", ID: "anyone"}}
	if _, err := NewStore(conn, WithStoreACL(split...)); err != nil {
		t.Errorf("ACL %v: %v", split, err)
	}

	// Arguments out of range are refused before any request: this
	// connection has no server.
	ctx := testCtx(t)
	// The fingerprint at its most (idempotency.MaxFingerprintLen) and an
	// owner that takes the two past what a node keeps.
	fp, owner := strings.Repeat("f", idempotency.MaxFingerprintLen), strings.Repeat("o", maxHeader)
	if _, err := s.Claim(ctx, idempotency.Claim{Key: "k", Fingerprint: fp, Owner: owner, Lease: time.Second}); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "fingerprint and owner") {
		t.Errorf("Claim with %d bytes of fingerprint and owner: %v, want ErrInvalid naming them", len(fp)+len(owner), err)
	}
	if _, err := s.Claim(ctx, idempotency.Claim{Key: "", Owner: "o", Lease: time.Second}); !errors.Is(err, idempotency.ErrInvalid) {
		t.Errorf("Claim with an empty key: %v, want ErrInvalid", err)
	}
	if err := s.Extend(ctx, "", "k", "o", 0); !errors.Is(err, idempotency.ErrInvalid) {
		t.Errorf("Extend with a zero lease: %v, want ErrInvalid", err)
	}
}

// TestStorePing: a store on a live server pings fine even before its root
// exists.
func TestStorePing(t *testing.T) {
	srv := servers(t)
	s := newTestStore(t, srv, WithStoreRoot(fmt.Sprintf("/warden-test/never-created-%d", time.Now().UnixNano())))
	if err := s.Ping(testCtx(t)); err != nil {
		t.Errorf("Ping: %v", err)
	}
	if ok, _, err := s.conn.Exists(s.root); err != nil || ok {
		t.Errorf("Ping created the root, or could not tell: %v, %v", ok, err)
	}
}

// TestStoreUnreachable: every call on an ensemble that cannot be reached
// fails with ErrUnavailable once the request timeout runs out, well within
// the caller's deadline, and no call outlives the caller's deadline when that
// comes first.
func TestStoreUnreachable(t *testing.T) {
	const requestTimeout = 300 * time.Millisecond
	calls := func(s *Store) map[string]func(ctx context.Context) error {
		return map[string]func(ctx context.Context) error{
			"Claim": func(ctx context.Context) error {
				_, err := s.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute})
				return err
			},
			"Extend":   func(ctx context.Context) error { return s.Extend(ctx, "", "k", "o", time.Minute) },
			"Complete": func(ctx context.Context) error { return s.Complete(ctx, "", "k", "o", []byte("r"), time.Minute) },
			"Abandon":  func(ctx context.Context) error { return s.Abandon(ctx, "", "k", "o") },
			"Get": func(ctx context.Context) error {
				_, err := s.Get(ctx, "", "k")
				return err
			},
			"Purge": func(ctx context.Context) error {
				_, err := s.Purge(ctx)
				return err
			},
			"Ping": s.Ping,
		}
	}
	// check runs every call on bounded, whose request timeout is
	// requestTimeout, then on unbounded, whose default one is longer than
	// the callers' deadlines.
	check := func(t *testing.T, bounded, unbounded *Store) {
		for name, call := range calls(bounded) {
			const deadline = 5 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			start := time.Now()
			err := call(ctx)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, idempotency.ErrUnavailable) {
				t.Errorf("%s: %v, want ErrUnavailable", name, err)
			}
			if took >= deadline {
				t.Errorf("%s returned after %v, past the caller's deadline of %v", name, took, deadline)
			}
		}
		for name, call := range calls(unbounded) {
			const deadline = 200 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			start := time.Now()
			err := call(ctx)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, idempotency.ErrUnavailable) {
				t.Errorf("%s with a %v deadline: %v, want the deadline or ErrUnavailable", name, deadline, err)
			}
			if took > deadline+time.Second {
				t.Errorf("%s returned %v after the caller's deadline of %v", name, took-deadline, deadline)
			}
		}
	}
	t.Run("Refused", func(t *testing.T) {
		addr := deadAddr(t)
		check(t, newTestStore(t, []string{addr}, WithStoreRequestTimeout(requestTimeout)), newTestStore(t, []string{addr}))
	})
	t.Run("Silent", func(t *testing.T) {
		// Connected first, then partitioned: requests go out and no
		// answer ever comes back.
		p := drivertest.StartProxy(t, servers(t)[0])
		bounded := newTestStore(t, []string{p.Addr()}, WithStoreRequestTimeout(requestTimeout))
		unbounded := newTestStore(t, []string{p.Addr()})
		for _, s := range []*Store{bounded, unbounded} {
			if _, err := s.Get(testCtx(t), "", fmt.Sprintf("probe-%d", time.Now().UnixNano())); !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("Get through the proxy before the partition: %v", err)
			}
			if err := s.Ping(testCtx(t)); err != nil {
				t.Fatalf("Ping through the proxy before the partition: %v", err)
			}
		}
		p.Blackhole()
		check(t, bounded, unbounded)
	})
}

// nodeName is what escape makes of any bytes.
var nodeName = regexp.MustCompile(`^[A-Za-z0-9_:.%-]+$`)

// TestStoreOddKeys: scopes and keys of any bytes come back byte for byte,
// each pair in a node of its own whose name ZooKeeper accepts, and pairs that
// would collide if simply joined stay apart.
func TestStoreOddKeys(t *testing.T) {
	srv := servers(t)
	a, b := newTestStore(t, srv), newTestStore(t, srv)
	ctx := testCtx(t)
	// Records outlive the test on the shared server: a part unique to the
	// run keeps an earlier run's record from answering.
	u := fmt.Sprintf("odd-%d-%d", time.Now().UnixNano(), keySeq.Add(1))
	var all [256]byte
	for i := range all {
		all[i] = byte(i)
	}
	pairs := [][2]string{
		{u, "."}, {u, ".."}, {u, "zookeeper"}, {u, "/"}, {u, "//a/../b/"}, {u, "%"}, {u, "%25"},
		{u, "\x00"}, {u, "\x00\x00"}, {u + "\x00", "\x00"}, {u, "\xff\xfe\x80"}, {u, "ключ 🔑 鍵"},
		{u + "a", "bc"}, {u + "ab", "c"}, {u + ":", "x"}, {u, ":x"}, {u + "/", "x"}, {u, "/x"},
		{u, strings.Repeat("\x00", idempotency.MaxKeyLen)},
		{".", u}, {"", u}, {"\x00", u}, {"/", u}, {"..", "/" + u},
		{string(all[:idempotency.MaxScopeLen]), u},
		{string(all[:idempotency.MaxScopeLen]), u + string(all[len(u)+1:])[:idempotency.MaxKeyLen-len(u)]},
	}
	paths := map[string]int{}
	for i, p := range pairs {
		bucket, path := a.place(p[0], p[1])
		name := path[len(bucket)+1:]
		if !nodeName.MatchString(name) || name == "." || name == ".." || strings.HasPrefix(name, ".") {
			t.Errorf("pair %d: node name %q", i, name)
		}
		if j, dup := paths[path]; dup {
			t.Errorf("pairs %d and %d share the node %s", j, i, path)
		}
		paths[path] = i

		c := idempotency.Claim{Scope: p[0], Key: p[1], Fingerprint: fmt.Sprintf("fp\x00%d", i), Owner: fmt.Sprintf("owner-%s-%d", u, i), Lease: time.Minute}
		if rec, err := a.Claim(ctx, c); err != nil || rec != nil {
			t.Fatalf("pair %d: Claim: (%v, %v), want a free key", i, rec, err)
		}
		resp := []byte(p[0] + "\xff" + p[1])
		if err := a.Complete(ctx, p[0], p[1], c.Owner, resp, time.Minute); err != nil {
			t.Fatalf("pair %d: Complete: %v", i, err)
		}
		rec, err := b.Get(ctx, p[0], p[1])
		if err != nil {
			t.Fatalf("pair %d: Get: %v", i, err)
		}
		if rec.Scope != p[0] || rec.Key != p[1] || rec.Fingerprint != c.Fingerprint || rec.Owner != c.Owner ||
			rec.State != idempotency.StateCompleted || !bytes.Equal(rec.Response, resp) {
			t.Errorf("pair %d: Get(%q, %q) = %+v", i, p[0], p[1], rec)
		}
		// The record is the node place names, as the server sees it.
		if ok, _, err := b.conn.Exists(path); err != nil || !ok {
			t.Errorf("pair %d: node %s: exists %v, %v", i, path, ok, err)
		}
	}
}

// TestStoreLargeResponses: responses beyond one node's share are kept in
// parts, children of the record, and come back whole to another client.
func TestStoreLargeResponses(t *testing.T) {
	srv := servers(t)
	a, b := newTestStore(t, srv), newTestStore(t, srv)
	ctx := testCtx(t)
	for _, size := range []int{partSize, partSize + 1, 3*partSize + 7} {
		k := fmt.Sprintf("large-%d-%d-%d", size, time.Now().UnixNano(), keySeq.Add(1))
		resp := bytes.Repeat([]byte{byte(size), 0, 0xff}, size/3+1)[:size]
		c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "o-" + k, Lease: time.Minute}
		if rec, err := a.Claim(ctx, c); err != nil || rec != nil {
			t.Fatalf("Claim: (%v, %v)", rec, err)
		}
		if err := a.Complete(ctx, "", k, c.Owner, resp, time.Minute); err != nil {
			t.Fatalf("Complete with %d bytes: %v", size, err)
		}
		_, path := a.place("", k)
		kids, _, err := b.conn.Children(path)
		if err != nil {
			t.Fatal(err)
		}
		wantParts := 0
		if size > partSize {
			wantParts = (size + partSize - 1) / partSize
		}
		if len(kids) != 1+wantParts {
			t.Errorf("%d bytes: record has children %v, want its incarnation child and %d parts", size, kids, wantParts)
		}
		rec, err := b.Claim(ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "other", Lease: time.Minute})
		if err != nil || rec == nil {
			t.Fatalf("duplicate Claim: (%v, %v)", rec, err)
		}
		if rec.State != idempotency.StateCompleted || !bytes.Equal(rec.Response, resp) {
			t.Errorf("%d bytes: duplicate got %s with %d bytes, not the response stored", size, rec.State, len(rec.Response))
		}
	}
}

// TestStorePurge: Purge deletes expired claims and completed records past
// their retention, parts included, keeps live ones and leaves alone nodes the
// store did not write.
func TestStorePurge(t *testing.T) {
	srv := servers(t)
	// A root of its own, so that each Purge reads only this test's records.
	root := fmt.Sprintf("/warden-test/idem-purge-%d", time.Now().UnixNano())
	s := newTestStore(t, srv, WithStoreRoot(root))
	ctx := testCtx(t)
	u := fmt.Sprint(time.Now().UnixNano())
	claim := func(k string, lease time.Duration) idempotency.Claim {
		c := idempotency.Claim{Key: k, Owner: "o-" + k, Lease: lease}
		if rec, err := s.Claim(ctx, c); err != nil || rec != nil {
			t.Fatalf("Claim(%q): (%v, %v)", k, rec, err)
		}
		return c
	}
	short, long, done := "short-"+u, "long-"+u, "done-"+u
	claim(short, 200*time.Millisecond)
	claim(long, time.Minute)
	c := claim(done, time.Minute)
	if err := s.Complete(ctx, "", done, c.Owner, make([]byte, 2*partSize+1), 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Nodes the store did not write: beside the buckets, and in one.
	foreign := []string{root + "/not-a-bucket"}
	bucket, _ := s.place("", long)
	foreign = append(foreign, bucket+"/foreign")
	for _, p := range foreign {
		if _, err := s.conn.Create(p, []byte("not a record"), zk.FlagPersistent, s.acl); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { removeTree(s.conn, root) })

	exists := func(k string) bool {
		_, path := s.place("", k)
		ok, _, err := s.conn.Exists(path)
		if err != nil {
			t.Fatalf("Exists: %v", err)
		}
		return ok
	}
	var purged int64
	waitFor(t, "Purge deletes the expired claim and the completed record past its retention", 50*time.Millisecond, func() bool {
		n, err := s.Purge(ctx)
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		purged += n
		return !exists(short) && !exists(done)
	})
	if purged != 2 {
		t.Errorf("Purge reported %d records deleted, want 2", purged)
	}
	if rec, err := s.Get(ctx, "", long); err != nil || rec.Owner != "o-"+long {
		t.Errorf("the live claim after Purge: (%v, %v)", rec, err)
	}
	for _, p := range foreign {
		if ok, _, err := s.conn.Exists(p); err != nil || !ok {
			t.Errorf("foreign node %s after Purge: exists %v, %v", p, ok, err)
		}
	}
}

// removeTree deletes path and everything under it, best effort.
func removeTree(conn *zk.Conn, path string) {
	kids, _, _ := conn.Children(path)
	for _, k := range kids {
		removeTree(conn, path+"/"+k)
	}
	conn.Delete(path, -1)
}

// TestStoreMalformedRecord: data the store did not write is an error, never
// a free key.
func TestStoreMalformedRecord(t *testing.T) {
	srv := servers(t)
	s := newTestStore(t, srv)
	ctx := testCtx(t)
	k := fmt.Sprintf("malformed-%d", time.Now().UnixNano())
	bucket, path := s.place("", k)
	if err := s.ensure(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	if _, err := s.conn.Create(path, []byte("not a record"), zk.FlagPersistent, s.acl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Delete(path, -1) })
	if rec, err := s.Get(ctx, "", k); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Get: (%v, %v), want ErrUnavailable", rec, err)
	}
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o", Lease: time.Minute}); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Claim: (%v, %v), want ErrUnavailable", rec, err)
	}
	if err := s.Abandon(ctx, "", k, "o"); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Abandon: %v, want ErrUnavailable", err)
	}
}

// TestStoreFencesRecreatedRecord: a record deleted and created again starts
// over at version 0, so a stale owner's write conditional on version 0 alone
// would land on the new owner's record. The incarnation child must refuse
// it.
func TestStoreFencesRecreatedRecord(t *testing.T) {
	srv := servers(t)
	a, b := newTestStore(t, srv), newTestStore(t, srv)
	ctx := testCtx(t)
	k := fmt.Sprintf("recreated-%d-%d", time.Now().UnixNano(), keySeq.Add(1))
	stale := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "stale", Lease: 200 * time.Millisecond}
	if rec, err := a.Claim(ctx, stale); err != nil || rec != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	_, path := a.place("", k)
	// The stale owner reads its record, then stalls past its lease.
	old, oldStat, err := a.owned(ctx, path, k, stale.Owner, "complete")
	if err != nil {
		t.Fatal(err)
	}
	fresh := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "fresh", Lease: time.Minute}
	waitFor(t, "the stale lease expires and the new owner claims the key", 20*time.Millisecond, func() bool {
		rec, err := b.Claim(ctx, fresh)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		return rec == nil
	})
	_, newStat, err := b.conn.Get(path)
	if err != nil {
		t.Fatal(err)
	}
	if newStat.Version != oldStat.Version || newStat.Czxid == oldStat.Czxid {
		t.Fatalf("the new record is at version %d (czxid %d), the stale read at %d (czxid %d): the test needs equal versions of different nodes",
			newStat.Version, newStat.Czxid, oldStat.Version, oldStat.Czxid)
	}

	late := old
	late.state, late.dur = idempotency.StateCompleted, millis(time.Minute)
	if err := a.update(ctx, path, k, "complete", old, oldStat, late, late.encode([]byte("late"))); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("stale conditional write: %v, want ErrNotOwner", err)
	}
	if err := a.remove(ctx, path, oldStat.Version, old); !errors.Is(err, zk.ErrNoNode) {
		t.Errorf("stale conditional delete: %v, want the incarnation child missing", err)
	}
	rec, err := a.Get(ctx, "", k)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Owner != fresh.Owner || rec.State != idempotency.StateInProgress || len(rec.Response) != 0 {
		t.Errorf("the new owner's record became %+v", rec)
	}
}

// TestStoreRecordEncoding: records round-trip, and data cut short or
// altered is refused rather than read as something else.
func TestStoreRecordEncoding(t *testing.T) {
	r := stored{state: idempotency.StateCompleted, dur: 86_400_000, fingerprint: "fp\x00", owner: "owner", total: 3, response: []byte{0, 1, 2}}
	copy(r.inc[:], "0123456789abcdef")
	copy(r.wid[:], "wid-8byt")
	data := r.encode(r.response)
	got, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.state != r.state || got.dur != r.dur || got.inc != r.inc || got.wid != r.wid || got.fingerprint != r.fingerprint ||
		got.owner != r.owner || got.total != r.total || got.parts != 0 || !bytes.Equal(got.response, r.response) {
		t.Errorf("decode(encode(r)) = %+v, want %+v", got, r)
	}
	for n := range len(data) {
		if _, err := decode(data[:n]); !errors.Is(err, errMalformed) {
			t.Errorf("decode of the first %d of %d bytes: %v, want errMalformed", n, len(data), err)
		}
	}
	for _, v := range [][]byte{nil, []byte("not a record"), append([]byte{recordFormat + 1}, data[1:]...), append([]byte{recordFormat, 9}, data[2:]...)} {
		if _, err := decode(v); !errors.Is(err, errMalformed) {
			t.Errorf("decode(%q): %v, want errMalformed", v, err)
		}
	}
	// A record in parts keeps no response of its own.
	p := stored{state: idempotency.StateCompleted, parts: 2, total: partSize + 1}
	if got, err := decode(p.encode(nil)); err != nil || got.parts != 2 || got.total != partSize+1 {
		t.Errorf("record in parts: (%+v, %v)", got, err)
	}
	if _, err := decode(p.encode([]byte("x"))); !errors.Is(err, errMalformed) {
		t.Errorf("record in parts with inline bytes: %v, want errMalformed", err)
	}
}

func TestStoreMillis(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		time.Nanosecond:                    1,
		time.Millisecond:                   1,
		time.Millisecond + time.Nanosecond: 2,
		1500 * time.Microsecond:            2,
		time.Hour:                          3_600_000,
		time.Duration(1<<63 - 1):           9_223_372_036_855,
	} {
		if got := millis(d); got != want {
			t.Errorf("millis(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestStoreLateWriteUndone: an owner whose lease ran out, with no one else
// claiming since, writes anyway; the store sees by the write's own time that
// the lease had expired first, and deletes the record again (parts and all)
// instead of reviving it. The target is never read by anyone else, so only
// the undo can have deleted it.
func TestStoreLateWriteUndone(t *testing.T) {
	srv := servers(t)
	s := newTestStore(t, srv)
	ctx := testCtx(t)
	for _, op := range []string{"extend", "complete"} {
		u := fmt.Sprintf("%s-%d-%d", op, time.Now().UnixNano(), keySeq.Add(1))
		target, control := "late-"+u, "control-"+u
		const lease = 200 * time.Millisecond
		for _, k := range []string{target, control} {
			if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o-" + k, Lease: lease}); err != nil || rec != nil {
				t.Fatalf("Claim(%q): (%v, %v)", k, rec, err)
			}
		}
		// The control key, claimed after the target with the same lease,
		// expires on the server's clock no sooner than the target.
		waitFor(t, "the control claim expires", 20*time.Millisecond, func() bool {
			_, err := s.Get(ctx, "", control)
			if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("Get: %v", err)
			}
			return err != nil
		})
		var err error
		if op == "extend" {
			err = s.Extend(ctx, "", target, "o-"+target, time.Minute)
		} else {
			err = s.Complete(ctx, "", target, "o-"+target, make([]byte, partSize+1), time.Minute)
		}
		if !errors.Is(err, idempotency.ErrNotOwner) || !strings.Contains(err.Error(), "lease expired") {
			t.Errorf("late %s: %v, want ErrNotOwner for an expired lease", op, err)
		}
		_, path := s.place("", target)
		if ok, _, err := s.conn.Exists(path); err != nil || ok {
			t.Errorf("after the late %s the record exists: %v, %v", op, ok, err)
		}
	}
}

// TestStoreRemovesLeftovers: children the store does not know of, such as
// the parts of a completion cut off half way, do not keep a record from
// being deleted.
func TestStoreRemovesLeftovers(t *testing.T) {
	srv := servers(t)
	s := newTestStore(t, srv)
	ctx := testCtx(t)
	k := fmt.Sprintf("leftovers-%d-%d", time.Now().UnixNano(), keySeq.Add(1))
	c := idempotency.Claim{Key: k, Owner: "o", Lease: time.Minute}
	if rec, err := s.Claim(ctx, c); err != nil || rec != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	_, path := s.place("", k)
	for _, name := range []string{"p-00112233aabbccdd-0", "p-00112233aabbccdd-1"} {
		if _, err := s.conn.Create(path+"/"+name, []byte("orphan"), zk.FlagPersistent, s.acl); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Abandon(ctx, "", k, c.Owner); err != nil {
		t.Fatalf("Abandon with leftover children: %v", err)
	}
	if ok, _, err := s.conn.Exists(path); err != nil || ok {
		t.Errorf("after Abandon the record exists: %v, %v", ok, err)
	}
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "retry", Lease: time.Minute}); err != nil || rec != nil {
		t.Errorf("Claim after Abandon: (%v, %v), want a free key", rec, err)
	}
}
