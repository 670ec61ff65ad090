package consullock

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// eventually waits, up to within, for cond to hold, and fails the test
// saying what did not happen when it does not.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}

// TestWrittenOverKeyReleased: a key written over while held (consul kv put
// keeps the key's session, and changes its ModifyIndex) is released by
// its holder's Release. Its release, checked on the old ModifyIndex,
// failed: Release reported ErrNotHeld, and the session kept the key, and
// the lock, for as long as it lived.
func TestWrittenOverKeyReleased(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := driver.AcquireOptions{TTL: MinTTL, Owner: "holder"}
	for what, acquire := range acquirers(l) {
		k := name("written-over")
		le, err := acquire(ctx, k, opts)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		held := le.(*lease)
		if _, err := c.KV().Put(&api.KVPair{Key: held.key, Value: []byte("an operator's")}, nil); err != nil {
			t.Fatal(err)
		}
		if kv, _, err := c.KV().Get(held.key, nil); err != nil || kv == nil || kv.Session != held.s.id || kv.ModifyIndex == held.token {
			t.Fatalf("%s: the key after the put: %+v, %v; want it still acquired by the holder's session, with a new ModifyIndex", what, kv, err)
		}
		if err := le.Refresh(ctx, MinTTL); err != nil {
			t.Errorf("%s: Refresh of the key written over: %v", what, err)
		}
		if err := le.Release(ctx); err != nil {
			t.Errorf("%s: Release of the key written over: %v", what, err)
		}
		if kv, _, err := c.KV().Get(held.key, nil); err != nil || kv != nil {
			t.Errorf("%s: the key after the release: %+v, %v; want it gone", what, kv, err)
		}
	}
}

// acquirers returns l's ways of acquiring a name, by the name of each: a
// lock, a read/write lock's reader and writer, a semaphore's permit (of
// one).
func acquirers(l *Locker) map[string]func(context.Context, string, driver.AcquireOptions) (driver.Lease, error) {
	return map[string]func(context.Context, string, driver.AcquireOptions) (driver.Lease, error){
		"Acquire": l.Acquire, "AcquireRead": l.AcquireRead, "AcquireWrite": l.AcquireWrite,
		"AcquireSemaphore": func(ctx context.Context, k string, opts driver.AcquireOptions) (driver.Lease, error) {
			return l.AcquireSemaphore(ctx, k, 1, opts)
		},
	}
}

// TestNames: names that differ only in a trailing space or slash, in case,
// in dot segments or a NUL byte are locks of their own; a name too long
// for Consul's keys is refused with ErrInvalidKey by every method at once.
// It was sent: Consul refused the transaction (413), and a waiting
// acquisition sent it again until its context ended.
func TestNames(t *testing.T) {
	l := lockerOn(t, newClient(t, addr(t)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := name("names")
	tokens := map[uint64]string{}
	for _, k := range []string{base, base + " ", base + "/", base + "//", base + "/.", base + "/..", base + "/../x", base + "\x00",
		strings.ToUpper(base), base + "/a", base + "/A", base + "%2F", base + ".lock", base + "/" + strings.Repeat("é", 200)} {
		le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Owner: k})
		if err != nil {
			t.Fatalf("Acquire(%q): %v; want every name its own lock", k, err)
		}
		if prev, ok := tokens[le.Token()]; ok {
			t.Fatalf("%q and %q share the token %d", k, prev, le.Token())
		}
		tokens[le.Token()] = k
		if in, err := l.Inspect(ctx, k); err != nil || len(in.Holders) != 1 || in.Holders[0].Owner != k {
			t.Errorf("Inspect(%q): %+v, %v; want its own holder", k, in, err)
		}
	}

	// The longest name fits a forced release's largest transaction.
	longest := name("longest")
	longest += strings.Repeat("k", maxEscaped-len(url.PathEscape(longest)))
	for range maxForced + 1 {
		if _, err := l.AcquireSemaphore(ctx, longest, maxForced+1, driver.AcquireOptions{TTL: MinTTL}); err != nil {
			t.Fatalf("the longest name: %v", err)
		}
	}
	if removed, err := l.ForceRelease(ctx, longest, driver.ReleaseTarget{AnyHolder: true}); err != nil || len(removed) != maxForced+1 {
		t.Errorf("ForceRelease of the longest name: %d removed, %v; want %d", len(removed), err, maxForced+1)
	}
	for _, k := range []string{longest + "k", strings.Repeat("\x00", maxEscaped/3+1), strings.Repeat("k", 1<<20)} {
		for _, opts := range []driver.AcquireOptions{{TTL: MinTTL}, {TTL: MinTTL, Wait: true}} {
			for what, acquire := range acquirers(l) {
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				le, err := acquire(actx, k, opts)
				cancel()
				if le != nil || !errors.Is(err, driver.ErrInvalidKey) {
					t.Errorf("%s of %d bytes, wait %v: %v; want ErrInvalidKey", what, len(k), opts.Wait, err)
				}
			}
		}
		if _, err := l.Inspect(ctx, k); !errors.Is(err, driver.ErrInvalidKey) {
			t.Errorf("Inspect of %d bytes: %v; want ErrInvalidKey", len(k), err)
		}
		if _, err := l.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); !errors.Is(err, driver.ErrInvalidKey) {
			t.Errorf("ForceRelease of %d bytes: %v; want ErrInvalidKey", len(k), err)
		}
		if _, err := l.List(ctx, k, "", 1); !errors.Is(err, driver.ErrInvalidKey) {
			t.Errorf("List of a prefix of %d bytes: %v; want ErrInvalidKey", len(k), err)
		}
	}
}

// TestNamespaceRefusedAtOnce: a client configured with a namespace, which
// Consul without Enterprise refuses for every request (400), fails a
// waiting acquisition at once with Consul's reason: it was taken for an
// outage and sent again until its context ended.
func TestNamespaceRefusedAtOnce(t *testing.T) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Namespace = addr(t), "team-a"
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, opts := range []driver.AcquireOptions{{TTL: MinTTL}, {TTL: MinTTL, Wait: true}, {TTL: MinTTL, Wait: true, Fair: true}} {
		le, err := l.Acquire(ctx, name("namespace"), opts)
		if le != nil || !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "Namespaces are a Consul Enterprise feature") {
			t.Errorf("Acquire(%+v): %v; want the refusal, at once", opts, err)
		}
	}
	if _, err := l.Inspect(ctx, name("namespace")); !errors.Is(err, errRefused) {
		t.Errorf("Inspect: %v; want the refusal", err)
	}
}

// TestSnapshotRestore: a snapshot restored (consul snapshot restore) puts
// Consul's keys back as they were when it was taken, and tells no
// holder: a lock released since comes back held by its old session, which
// its Locker renews for as long as it lives, and a lock acquired since,
// by a session older than the snapshot, is free for another process while
// its holder goes on.
func TestSnapshotRestore(t *testing.T) {
	t.Skip("defect: a restored snapshot is not detected; see the package documentation (Operators)")
	_, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, other := lockerOn(t, root), lockerOn(t, root)
	opts := driver.AcquireOptions{TTL: MinTTL}
	released, held := name("restore-released"), name("restore-held")
	le, err := l.Acquire(ctx, released, opts)
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := root.Snapshot().Save(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if le, err = l.Acquire(ctx, held, opts); err != nil {
		t.Fatal(err)
	}
	if err := root.Snapshot().Restore(nil, snap); err != nil {
		t.Fatal(err)
	}
	s := le.(*lease).s
	eventually(t, 10*time.Second, "the holder of the lock the restore took told of its loss", func() bool {
		select {
		case <-s.Done():
			return true
		default:
			return false
		}
	})
	eventually(t, 2*MinTTL, "the lock released before the restore free again", func() bool {
		le, err := other.Acquire(ctx, released, opts)
		return le != nil && err == nil
	})
}

// TestLockDelay: a key in the lock-delay of another tool's session fails
// an acquisition that does not wait with an error that names the delay,
// and a waiting one takes it once the delay is over. The error said that
// the acquiring session was lost.
func TestLockDelay(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := name("lock-delay")
	id, _, err := c.Session().Create(&api.SessionEntry{LockDelay: 5 * time.Second, Behavior: api.SessionBehaviorDelete}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: LockKey(k), Session: id}, nil); !ok || err != nil {
		t.Fatalf("acquiring the key by the other session: %v, %v", ok, err)
	}
	if _, err := c.Session().Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
	le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL})
	if le != nil || !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, errSessionLost) || !strings.Contains(err.Error(), "lock delay") {
		t.Errorf("Acquire in the lock-delay: %v; want ErrUnavailable naming the delay", err)
	}
	if le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Wait: true}); err != nil {
		t.Errorf("waiting Acquire: %v; want the lock once the delay is over", err)
	} else {
		le.Release(ctx)
	}
}

// TestSessionlessKeyTaken: a lock key written by hand where no lock is
// held (consul kv put), which Inspect reports free, is taken by an
// acquisition that does not wait, as by a waiting one; it was found held
// for as long as the key stood. The session's own key stays held for the
// Locker's other acquisitions.
func TestSessionlessKeyTaken(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := name("sessionless")
	if _, err := c.KV().Put(&api.KVPair{Key: LockKey(k), Value: []byte("by hand")}, nil); err != nil {
		t.Fatal(err)
	}
	opts := driver.AcquireOptions{TTL: MinTTL, Owner: "me"}
	le, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatalf("Acquire of the key written by hand: %v", err)
	}
	if kv, _, err := c.KV().Get(LockKey(k), nil); err != nil || kv == nil || kv.ModifyIndex != le.Token() {
		t.Errorf("the key after the acquisition: %+v, %v; want the token %d its ModifyIndex", kv, err, le.Token())
	}
	if again, err := l.Acquire(ctx, k, opts); again != nil || !errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("Acquire by the holder's Locker: %v, %v; want ErrNotAcquired", again, err)
	}
	want := []driver.Holding{{Owner: "me", Token: le.Token(), SessionBound: true}}
	if in, err := l.Inspect(ctx, k); err != nil || !slices.Equal(in.Holders, want) {
		t.Errorf("Inspect: %+v, %v; want %+v", in, err, want)
	}
	if err := le.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if kv, _, err := c.KV().Get(LockKey(k), nil); err != nil || kv != nil {
		t.Errorf("the key after the release: %+v, %v; want it gone", kv, err)
	}
}

// TestUnlockedKeyRetaken: a key unlocked with its session's id (consul kv
// put -release -session=<id>) keeps its CreateIndex and loses its session,
// and the same Locker's next acquisition takes it by the same session,
// with the same CreateIndex. The first lease's claim ends with that grant
// (it is revoked), and its release never deletes the key the second lease
// holds: it did, and another Locker then took the lock the second held.
func TestUnlockedKeyRetaken(t *testing.T) {
	c := newClient(t, addr(t))
	l, other := lockerOn(t, c), lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := driver.AcquireOptions{TTL: MinTTL}
	k := name("retaken")
	first, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	revoked := make(chan struct{})
	first.(driver.RevocableLease).OnRevoke(func() { close(revoked) })
	if ok, _, err := c.KV().Release(&api.KVPair{Key: LockKey(k), Session: first.(*lease).s.id}, nil); !ok || err != nil {
		t.Fatalf("unlocking the key: %v, %v", ok, err)
	}
	second, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatalf("Acquire of the unlocked key: %v", err)
	}
	if first.(*lease).created != second.(*lease).created {
		t.Fatalf("CreateIndex %d then %d: the key was not taken over as it stood", first.(*lease).created, second.(*lease).created)
	}
	select {
	case <-revoked:
	default:
		t.Error("the first lease was not revoked by the second grant of its key")
	}
	if err := first.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release of the first lease: %v; want ErrNotHeld", err)
	}
	if le, err := other.Acquire(ctx, k, opts); !errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("another Locker's Acquire while the second lease holds: %v, %v; want ErrNotAcquired", le, err)
	}
	if err := second.Release(ctx); err != nil {
		t.Errorf("Release of the second lease: %v", err)
	}
}

// TestWrittenOverWriterBlocksReaders: a writer's key written over (consul
// kv put sets its Flags to 0) still blocks readers: a key of unknown kind
// blocks every other kind. A reader was granted while the writer held.
func TestWrittenOverWriterBlocksReaders(t *testing.T) {
	c := newClient(t, addr(t))
	l, other := lockerOn(t, c), lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := driver.AcquireOptions{TTL: MinTTL}
	k := name("written-over-writer")
	w, err := l.AcquireWrite(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(&api.KVPair{Key: w.(*lease).key, Value: []byte("an operator's")}, nil); err != nil {
		t.Fatal(err)
	}
	if r, err := other.AcquireRead(ctx, k, opts); !errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("AcquireRead while the writer holds: %v, %v; want ErrNotAcquired", r, err)
	}
	if err := w.Release(ctx); err != nil {
		t.Errorf("Release of the writer: %v", err)
	}
}

// TestForceReleaseAfterPut: ForceRelease of a key written over (consul kv
// put, which changes its ModifyIndex) reaches its holder. The marker was
// named after the key's ModifyIndex, which the holder's lease, with the
// token of its acquisition, never matched: the holder was never told, and
// its session lived on, while another Locker took the lock.
func TestForceReleaseAfterPut(t *testing.T) {
	c := newClient(t, addr(t))
	l, other := lockerOn(t, c), lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := driver.AcquireOptions{TTL: MinTTL, Owner: "holder"}
	for what, acquire := range acquirers(l) {
		k := name("forced-after-put")
		le, err := acquire(ctx, k, opts)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		revoked := make(chan struct{})
		le.(driver.RevocableLease).OnRevoke(func() { close(revoked) })
		if _, err := c.KV().Put(&api.KVPair{Key: le.(*lease).key, Value: []byte("an operator's")}, nil); err != nil {
			t.Fatal(err)
		}
		if removed, err := other.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil || len(removed) != 1 {
			t.Fatalf("%s: ForceRelease: %v, %v; want one holding removed", what, removed, err)
		}
		select {
		case <-revoked:
		case <-time.After(5 * time.Second):
			t.Errorf("%s: the holder was not told of the forced release within 5 s", what)
		}
	}
}

// TestStrayMarkerForgotten: a marker that names no holding of the session
// (its lease released meanwhile, or written by hand) is deleted and not
// kept: the session kept it for ever, for an acquisition that would never
// come.
func TestStrayMarkerForgotten(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	le, err := l.Acquire(ctx, name("stray-marker"), driver.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	s := le.(*lease).s
	stray := marker(s.id, LockKey(name("nothing-held")), 1)
	if _, err := c.KV().Put(&api.KVPair{Key: stray}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the stray marker deleted", func() bool {
		kv, _, err := c.KV().Get(stray, nil)
		return err == nil && kv == nil
	})
	s.mu.Lock()
	kept := len(s.revoked)
	s.mu.Unlock()
	if kept != 0 {
		t.Errorf("%d revocations kept that match nothing", kept)
	}
	if err := le.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// TestWrittenOverKeyReleasedByResend: a release of a key written over
// (consul kv put) whose first send goes unanswered within resendAfter is
// sent again, and the key, still the lease's, is deleted. The resend
// counted the changed ModifyIndex as an earlier send's release, and
// Release returned nil while the session kept the key, and the lock.
func TestWrittenOverKeyReleasedByResend(t *testing.T) {
	a := addr(t)
	root := newClient(t, a)
	var delay atomic.Bool
	l := lockerOn(t, clientThrough(t, a, "", func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := base.RoundTrip(r)
			if err == nil && r.URL.Path == "/v1/txn" && delay.CompareAndSwap(true, false) {
				// Sent, and its answer lost: the send times out.
				resp.Body.Close()
				<-r.Context().Done()
				return nil, r.Context().Err()
			}
			return resp, err
		})
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := name("written-over-resent")
	le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.KV().Put(&api.KVPair{Key: LockKey(k), Value: []byte("an operator's")}, nil); err != nil {
		t.Fatal(err)
	}
	delay.Store(true)
	if err := le.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if kv, _, err := root.KV().Get(LockKey(k), nil); err != nil || kv != nil {
		t.Errorf("the key after the release: %+v, %v; want it gone", kv, err)
	}
}

// TestWrittenOverKeyReleasedDuringAcquisition: a key written over while
// held (consul kv put) is released by its holder even while the same
// Locker tries the key again. The try finds the key held by its own
// session and gives up, and the release, which took the try for a later
// grant that may hold the key, gave up too: the session kept the key, and
// the lock, for as long as it lived (15 of 15 rounds). The release now
// waits for the try to end and reads the key again.
func TestWrittenOverKeyReleasedDuringAcquisition(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := driver.AcquireOptions{TTL: MinTTL}
	for round := range 10 {
		k := name("written-over-tried")
		le, err := l.Acquire(ctx, k, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.KV().Put(&api.KVPair{Key: LockKey(k), Value: []byte("an operator's")}, nil); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		tried := make(chan []driver.Lease)
		go func() {
			var got []driver.Lease
			defer func() { tried <- got }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				g, err := l.Acquire(ctx, k, opts)
				switch {
				case err == nil:
					got = append(got, g)
				case !errors.Is(err, driver.ErrNotAcquired):
					t.Errorf("round %d: a try: %v", round, err)
					return
				}
			}
		}()
		rerr := le.Release(ctx)
		close(stop)
		for _, g := range <-tried {
			if err := g.Release(ctx); err != nil {
				t.Errorf("round %d: release of a later grant: %v", round, err)
			}
		}
		if rerr != nil && !errors.Is(rerr, driver.ErrNotHeld) {
			t.Errorf("round %d: Release of the key written over: %v", round, rerr)
		}
		if kv, _, err := c.KV().Get(LockKey(k), nil); err != nil || kv != nil {
			t.Fatalf("round %d: the key after every release: %+v, %v; want it gone (Release: %v)", round, kv, err, rerr)
		}
	}
}
