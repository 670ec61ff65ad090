package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/internal/forcedtest"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// TestForcedCause: a holder under guard.Do whose row ForceRelease takes
// reads that in its section's cause, not an expiry, whether it finds the
// row as the operator left it or, taken since by another, a later version
// before its own deadline.
func TestForcedCause(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			g := migrated(t, db, dsn)
			for _, taken := range []bool{false, true} {
				var taker driver.Locker
				if taken {
					taker = newLocker(t, openDB(t, db, dsn))
				}
				key := fmt.Sprintf("%s-%v-%d", t.Name(), taken, time.Now().UnixNano())
				cause := forcedtest.Cause(t, newLocker(t, g), taker, key, 3*time.Second)
				if !errors.Is(cause, guard.ErrLockLost) || !strings.Contains(cause.Error(), "by ForceRelease") {
					t.Errorf("taken %v: cause %v, want ErrLockLost naming ForceRelease", taken, cause)
				}
			}
		})
	}
}

// TestExpiredCause: a holder under guard.Do whose lease ends on the
// database's clock before it ends on its own (its row's lock_until moved
// into the past, as a database clock stepped forward would) reads an expiry
// in its section's cause, and no ForceRelease.
func TestExpiredCause(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g := migrated(t, db, db.dsn(t))
			key := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
			cause := forcedtest.Lost(t, newLocker(t, g), key, 3*time.Second, func(ctx context.Context, _ *guard.Guard) {
				// A microsecond after the grant: past, and not the
				// release's lock_until (locked_at).
				if err := g.WithContext(ctx).Exec("UPDATE "+sqllock.DefaultTable+" SET lock_until = locked_at + 1 WHERE name = ?", forcedtest.Prefix+key).Error; err != nil {
					t.Fatal(err)
				}
			})
			if !errors.Is(cause, guard.ErrLockLost) || !strings.Contains(cause.Error(), "expired (nobody took it since)") || strings.Contains(cause.Error(), "ForceRelease") {
				t.Errorf("cause %v, want ErrLockLost saying it expired, and no ForceRelease", cause)
			}
		})
	}
}

// TestNotHeldWhy: refused renewals and releases say why, as the lock's row
// tells (see forcedtest.Reasons).
func TestNotHeldWhy(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			g := migrated(t, db, dsn)
			key := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
			forcedtest.Reasons(t, newLocker(t, g), newLocker(t, openDB(t, db, dsn)), key)
		})
	}
}

// TestExpiryAfterRelease: a released lease keeps the expiry it had, which
// guard logs (a grant given back as late says when it would have ended),
// rather than a marker of its release read as a date centuries ago.
func TestExpiryAfterRelease(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			l := newLocker(t, migrated(t, db, dsn))
			ctx := context.Background()
			lease, err := l.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			before := lease.Expiry()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if after := lease.Expiry(); !after.Equal(before) {
				t.Errorf("Expiry after Release: %v, want %v as before it", after, before)
			}
		})
	}
}

// TestStoreNotGranted: a Store whose database user may not use its table
// fails every call with idempotency.ErrInvalid naming the grant, never as
// an outage, which httpmw's WithFailOpen would answer by serving keyed
// requests unguarded.
func TestStoreNotGranted(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	table := fmt.Sprintf("notgranted_%d", time.Now().UnixNano())
	owner, writer := rowWriter(t, db, dsn, table)
	ctx := context.Background()
	idem := table + "_idem"
	st, err := sqllock.NewStore(owner, sqllock.WithStoreTable(idem))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Exec("DROP TABLE " + idem) })
	denied, err := sqllock.NewStore(writer, sqllock.WithStoreTable(idem))
	if err != nil {
		t.Fatal(err)
	}
	_, err = denied.Claim(ctx, idempotency.Claim{Scope: "s", Key: "k", Owner: "o", Lease: time.Minute})
	if !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), "grant") {
		t.Errorf("Claim as a user not granted the table: %v, want idempotency.ErrInvalid naming the grant, not ErrUnavailable", err)
	}
}
