package sqllock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestCancelledAttemptGivenBack: an acquiring statement the waiter's ctx
// abandoned while the server still had it (here queued on the row lock of
// a transaction that releases the holder's lease) takes the lock when it
// runs after all; the attempt's owner then gives it back, so that the next
// client gets the lock at once rather than after the TTL, and its token is
// still past the abandoned attempt's.
func TestCancelledAttemptGivenBack(t *testing.T) {
	for _, db := range databases() {
		if db.name == "sqlite" {
			continue // one writer, in process: no statement outlives its call
		}
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			// A table of its own, which no other test's statement names,
			// so that the statement found waiting is the waiter's.
			const table = "warden_locks_cancel"
			g := migrated(t, db, dsn, sqllock.WithTable(table))
			ctx := context.Background()
			const ttl = 30 * time.Second
			holder := newLocker(t, openDB(t, db, dsn), sqllock.WithTable(table), sqllock.WithOwner("holder"))
			waiterDSN := dsn
			if db.name == "postgres" {
				// pgx follows an abandoned statement with a cancel
				// request, which may reach the server before or after
				// the statement has run: here it never does.
				waiterDSN = dropCancelRequests(t, dsn)
			}
			waiter := newLocker(t, openDB(t, db, waiterDSN), sqllock.WithTable(table), sqllock.WithOwner("waiter"))
			next := newLocker(t, openDB(t, db, dsn), sqllock.WithTable(table), sqllock.WithOwner("next"))
			k := uniqueKey(t)
			if _, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: ttl}); err != nil {
				t.Fatal(err)
			}
			// The holder's release, in a transaction left open: it keeps
			// the row locked, and the waiter's attempt queues on it.
			tx := g.Begin()
			t.Cleanup(func() { tx.Rollback() })
			if err := tx.Exec("UPDATE "+table+" SET lock_until = locked_at WHERE name = ?", k).Error; err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			got := make(chan error, 1)
			go func() {
				_, err := waiter.Acquire(wctx, k, driver.AcquireOptions{TTL: ttl, Wait: true})
				got <- err
			}()
			eventually(t, "the waiter's attempt to queue on the row lock", func() bool {
				select {
				case err := <-got:
					t.Fatalf("the waiter's Acquire returned before the cancel: %v", err)
				default:
				}
				var n int64
				if db.name == "postgres" {
					g.Raw("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE ?", "%INSERT INTO \""+table+"\" %").Scan(&n)
				} else {
					// MariaDB's processlist shows a statement queued on a
					// row lock in the Update state.
					g.Raw("SELECT count(*) FROM information_schema.processlist WHERE info LIKE ? AND state = 'Update'", "INSERT INTO `"+table+"`%").Scan(&n)
				}
				return n > 0
			})
			cancel()
			if err := <-got; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
			}
			if err := tx.Commit().Error; err != nil {
				t.Fatal(err)
			}
			// The abandoned attempt has run by now, or runs while the
			// next client waits, well within the TTL.
			var row struct {
				Owner   string
				Version int64
			}
			eventually(t, "the abandoned attempt's row", func() bool {
				g.Raw("SELECT owner, version FROM "+table+" WHERE name = ?", k).Scan(&row)
				return strings.HasPrefix(row.Owner, "waiter/")
			})
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			defer acancel()
			lease, err := next.Acquire(actx, k, driver.AcquireOptions{TTL: ttl, Wait: true})
			if err != nil {
				g.Raw("SELECT owner, version FROM "+table+" WHERE name = ?", k).Scan(&row)
				t.Fatalf("the next client: %v; the row is %+v's", err, row)
			}
			defer lease.Release(ctx)
			if lease.Token() <= uint64(row.Version) {
				t.Fatalf("token %d after the abandoned attempt's %d", lease.Token(), row.Version)
			}
		})
	}
}

// dropCancelRequests returns dsn, a PostgreSQL URL, through a proxy of its
// own that closes every connection opening with a cancel request, and
// passes the others on.
func dropCancelRequests(t *testing.T, dsn string) string {
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
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go proxy(c, server)
		}
	}()
	u.Host = ln.Addr().String()
	return u.String()
}

// cancelRequestCode is the code a PostgreSQL cancel request opens with,
// after its length (16).
const cancelRequestCode = 80877102

func proxy(c net.Conn, server string) {
	defer c.Close()
	var head [8]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return
	}
	if binary.BigEndian.Uint32(head[:4]) == 16 && binary.BigEndian.Uint32(head[4:]) == cancelRequestCode {
		return
	}
	s, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer s.Close()
	if _, err := s.Write(head[:]); err != nil {
		return
	}
	go func() {
		io.Copy(c, s)
		c.Close()
	}()
	io.Copy(s, c)
}
