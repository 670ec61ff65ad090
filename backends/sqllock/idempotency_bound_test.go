package sqllock_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/idempotency"
)

// What a blackHole drops.
const (
	holeNone    int32 = iota // forwards both ways
	holeAnswers              // drops what the server sends: requests land, their answers are lost
	holeBoth                 // drops both ways: the client is cut off
)

// blackHole is a TCP proxy to a server that forwards both ways until told
// to drop what passes, one way or both; its connections stay open, as
// through a partition, so that a client waits for answers that never come.
type blackHole struct {
	drop  atomic.Int32
	mu    sync.Mutex
	conns []net.Conn
}

// newBlackHole returns dsn, a PostgreSQL URL, through a blackHole of its
// own.
func newBlackHole(t *testing.T, dsn string) (string, *blackHole) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	server := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &blackHole{}
	t.Cleanup(func() {
		ln.Close()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			h.mu.Lock()
			h.conns = append(h.conns, c, s)
			h.mu.Unlock()
			go h.pump(s, c, holeBoth)
			go h.pump(c, s, holeAnswers)
		}
	}()
	u.Host = ln.Addr().String()
	return u.String(), h
}

// pump copies src to dst, dropping what it reads while the hole drops at
// least from.
func (h *blackHole) pump(dst, src net.Conn, from int32) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && h.drop.Load() < from {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestStoreUnansweredBounded: with pgx's defaults through database/sql, a
// request whose context has no deadline waits for the store no longer
// than the Executor's call timeout (and a scheduling margin) when the
// network black-holes the store, whether its claim lands with its answer
// lost or never gets there; the work does not run, and another process
// claims the key and runs it once, within the claim's lease.
func TestStoreUnansweredBounded(t *testing.T) {
	var pg database
	for _, db := range databases() {
		if db.name == "postgres" {
			pg = db
		}
	}
	for _, tc := range []struct {
		name string
		drop int32
	}{{"answers lost", holeAnswers}, {"cut off", holeBoth}} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pg.dsn(t)
			direct, err := sqllock.NewStore(openDB(t, pg, dsn))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := direct.Migrate(ctx); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			holed, hole := newBlackHole(t, dsn)
			st, err := sqllock.NewStore(openDB(t, pg, holed))
			if err != nil {
				t.Fatal(err)
			}
			const bound, lease, margin = time.Second, 3 * time.Second, 250 * time.Millisecond
			e, err := idempotency.New(st, idempotency.WithCallTimeout(bound), idempotency.WithLease(lease))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("done"), nil }
			if _, err := e.Do(ctx, uniqueKey(t)+"/warm", "fp", fn); err != nil {
				t.Fatalf("Do before the cut: %v", err)
			}
			runs.Store(0)
			k := uniqueKey(t)
			hole.drop.Store(tc.drop)
			start := time.Now()
			_, err = e.Do(ctx, k, "fp", fn)
			took := time.Since(start)
			if !errors.Is(err, idempotency.ErrUnavailable) || took > bound+margin {
				t.Fatalf("Do through the black hole: %v after %v, want ErrUnavailable within %v", err, took, bound+margin)
			}
			if runs.Load() != 0 {
				t.Fatal("the work ran without an answered claim")
			}
			other, err := idempotency.New(direct, idempotency.WithLease(lease))
			if err != nil {
				t.Fatal(err)
			}
			for {
				_, err := other.Do(ctx, k, "fp", fn)
				if err == nil {
					break
				}
				if !errors.Is(err, idempotency.ErrInProgress) || time.Since(start) > lease+2*time.Second {
					t.Fatalf("the other process after %v: %v, want the key claimable within the %v lease", time.Since(start), err, lease)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("Do returned after %v; the other process ran the work %v after the cut", took, time.Since(start))
			if n := runs.Load(); n != 1 {
				t.Errorf("the work ran %d times, want once", n)
			}
		})
	}
}
