package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestPurge: Purge deletes the rows of keys free for longer than its idle
// time, and only those whose token the clock has passed by as much, so that
// a key inserted again gets a greater token than any its row gave.
func TestPurge(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			table := fmt.Sprintf("warden_test_purge_%d", time.Now().UnixNano())
			g := migrated(t, db, db.dsn(t), sqllock.WithTable(table))
			t.Cleanup(func() { g.Exec("DROP TABLE IF EXISTS " + table) })
			l := newLocker(t, g, sqllock.WithTable(table))

			// Rows written long ago: one free for ages with a small
			// version, one free for ages whose version is far ahead of
			// the clock (tokens once drawn from a clock that ran fast).
			const ahead = int64(9e15)
			for _, row := range []struct {
				name    string
				version int64
			}{{"old", 41}, {"ahead", ahead}} {
				if err := g.Exec("INSERT INTO "+table+" (name, owner, version, lock_until, locked_at) VALUES (?, 'gone', ?, 0, 0)",
					row.name, row.version).Error; err != nil {
					t.Fatal(err)
				}
			}
			o := driver.AcquireOptions{TTL: time.Minute}
			held, err := l.Acquire(ctx, "held", o)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(ctx)
			recent, err := l.Acquire(ctx, "recent", o)
			if err != nil {
				t.Fatal(err)
			}
			if err := recent.Release(ctx); err != nil {
				t.Fatal(err)
			}

			if _, err := l.Purge(ctx, time.Minute-time.Second); !errors.Is(err, driver.ErrInvalidOption) {
				t.Errorf("Purge below MinPurgeIdle: got %v, want ErrInvalidOption", err)
			}
			n, err := l.Purge(ctx, sqllock.MinPurgeIdle)
			if err != nil {
				t.Fatalf("Purge: %v", err)
			}
			var names []string
			if err := g.Raw("SELECT name FROM " + table).Scan(&names).Error; err != nil {
				t.Fatal(err)
			}
			slices.Sort(names)
			if want := []string{"ahead", "held", "recent"}; n != 1 || !slices.Equal(names, want) {
				t.Errorf("Purge deleted %d rows and left %q, want 1 deleted and %q left", n, names, want)
			}

			again, err := l.Acquire(ctx, "old", o)
			if err != nil {
				t.Fatal(err)
			}
			if again.Token() <= 41 {
				t.Errorf("token of a purged key taken again: %d, not above its old row's 41", again.Token())
			}
			next, err := l.Acquire(ctx, "ahead", o)
			if err != nil {
				t.Fatal(err)
			}
			if next.Token() != uint64(ahead)+1 {
				t.Errorf("token of a key whose version ran ahead of the clock: %d, want %d", next.Token(), ahead+1)
			}
			again.Release(ctx)
			next.Release(ctx)
		})
	}
}

// TestTokensFromClock: a key's first token is the database's clock in
// microseconds, so that a key whose row was purged does not start again
// below the tokens it gave.
func TestTokensFromClock(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			l := newLocker(t, migrated(t, db, db.dsn(t)))
			before := time.Now()
			lease, err := l.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			// The test servers run on this host, on its clock.
			at := time.UnixMicro(int64(lease.Token()))
			if d := at.Sub(before); d < -time.Minute || d > time.Minute {
				t.Errorf("first token %d reads %v, %v from the acquisition", lease.Token(), at, d)
			}
		})
	}
}
