package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// lookalikeResources differ only in trailing spaces, letter case or Unicode
// normalisation: each is a resource of its own.
var lookalikeResources = []string{"r", "r ", "R", "\u00e9", "e\u0301"}

// TestFenceDistinctResources: fencing one resource with a high token says
// nothing about its lookalikes, which a first token of 1 still fences.
func TestFenceDistinctResources(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g := migrated(t, db, db.dsn(t))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			base := uniqueKey(t) + "/"
			fence := func(resource string, token uint64) error {
				return g.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					return sqllock.Fence(tx, resource, token)
				})
			}
			if err := fence(base+lookalikeResources[0], 5); err != nil {
				t.Fatal(err)
			}
			for _, r := range lookalikeResources[1:] {
				if err := fence(base+r, 1); err != nil {
					t.Errorf("first fence of %q, after %q was fenced with 5: %v", base+r, base+lookalikeResources[0], err)
				}
			}
		})
	}
}

// TestOddKeys: keys that differ by trailing spaces, letter case or Unicode
// normalisation are locks of their own on every database, each taken while
// the others are held; a key holding a NUL byte, which PostgreSQL's text
// cannot store, or invalid UTF-8 is refused as an invalid key by every call
// that takes one, on all three, not reported as the database being
// unavailable.
func TestOddKeys(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			l := newLocker(t, migrated(t, db, db.dsn(t)))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			o := driver.AcquireOptions{TTL: time.Minute}
			k := uniqueKey(t)
			hold(t, l, k, k+" ", k+"  ", strings.ToUpper(k), k+"\u00e9", k+"e\u0301")
			for _, key := range []string{k + "\x00", "\x00" + k, k + "\xff"} {
				if _, err := l.Acquire(ctx, key, o); !errors.Is(err, driver.ErrInvalidKey) {
					t.Errorf("Acquire(%q): %v, want ErrInvalidKey", key, err)
				}
				if _, err := l.Inspect(ctx, key); !errors.Is(err, driver.ErrInvalidKey) {
					t.Errorf("Inspect(%q): %v, want ErrInvalidKey", key, err)
				}
				if _, err := l.ForceRelease(ctx, key, driver.ReleaseTarget{AnyHolder: true}); !errors.Is(err, driver.ErrInvalidKey) {
					t.Errorf("ForceRelease(%q): %v, want ErrInvalidKey", key, err)
				}
			}
		})
	}
}

// TestMigrateBinaryKeys: a lock table and a fence table created by an
// earlier version, with VARCHAR key columns in a PAD SPACE collation, are
// converted by Migrate, rows kept, so that "k" and "k " become two locks.
func TestMigrateBinaryKeys(t *testing.T) {
	db := mariaDB()
	g := openDB(t, db, db.dsn(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table := fmt.Sprintf("warden_test_oldkeys_%d", time.Now().UnixNano())
	earlierTable(t, g, table, "varchar(255)", " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")
	l := newLocker(t, g, sqllock.WithTable(table))
	if err := l.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over the old table: %v", err)
	}
	if typ := columnType(t, g, table, "name"); typ != "varbinary" {
		t.Errorf("name column after Migrate: %s, want varbinary", typ)
	}
	// A table Migrate creates has it from the start.
	fresh := table + "_new"
	t.Cleanup(func() { g.Exec("DROP TABLE IF EXISTS " + fresh) })
	if err := newLocker(t, g, sqllock.WithTable(fresh)).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if typ := columnType(t, g, fresh, "name"); typ != "varbinary" {
		t.Errorf("name column of a new table: %s, want varbinary", typ)
	}
	o := driver.AcquireOptions{TTL: time.Minute}
	k, err := l.Acquire(ctx, "k", o)
	if err != nil {
		t.Fatalf("Acquire(k): %v", err)
	}
	if k.Token() <= 41 {
		t.Errorf("token of k after the migration: %d, not above the old row's 41", k.Token())
	}
	padded, err := l.Acquire(ctx, "k ", o)
	if err != nil {
		t.Fatalf(`Acquire("k ") while "k" is held: %v`, err)
	}
	if err := padded.Release(ctx); err != nil {
		t.Error(err)
	}
	if err := k.Release(ctx); err != nil {
		t.Error(err)
	}
	// Migrating again changes nothing.
	if err := l.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
}

// columnType is the MySQL data type of column in table.
func columnType(t *testing.T, g *gorm.DB, table, column string) string {
	t.Helper()
	var typ string
	err := g.Raw("SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?", table, column).Scan(&typ).Error
	if err != nil {
		t.Fatal(err)
	}
	return typ
}

// TestListOddBounds: List takes any bytes for its prefix and its after, as
// a prefix cut partway through a character ("caf\xc3") is, and answers them
// by byte order on every database: the keys that start with those bytes, or
// that sort after them. PostgreSQL refused them as invalid text, which
// List reported as the database being unavailable.
func TestListOddBounds(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			l := newLocker(t, migrated(t, db, db.dsn(t)))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			base := uniqueKey(t) + "/"
			// In byte order; é is c3 a9, ÿ c3 bf, Ā c4 80.
			hold(t, l, base+"caf", base+"cafe", base+"café", base+"cafÿ", base+"cafĀ", base+"cag")
			for _, c := range []struct {
				prefix, after string
				limit         int
				want          []string
			}{
				{"caf\xc3", "", 10, []string{"café", "cafÿ"}},
				{"caf\xc3", "", 1, []string{"café"}},
				{"caf\xc3", "café", 10, []string{"cafÿ"}},
				{"caf\xc3", "caf\xc3\xaa", 10, []string{"cafÿ"}},
				{"caf\xc3\xa9", "", 10, []string{"café"}},
				{"", "caf\xc3", 10, []string{"café", "cafÿ", "cafĀ", "cag"}},
				{"", "caf\x00", 10, []string{"cafe", "café", "cafÿ", "cafĀ", "cag"}},
				{"", "caf\xff", 10, []string{"cag"}},
				{"caf\x00", "", 10, nil},
				{"caf\xff", "", 10, nil},
				{"\xff", "", 10, nil},
			} {
				after := c.after
				if after != "" {
					after = base + after
				}
				page, err := l.List(ctx, base+c.prefix, after, c.limit)
				var got []string
				for _, p := range page {
					got = append(got, strings.TrimPrefix(p.Key, base))
				}
				if err != nil || !slices.Equal(got, c.want) {
					t.Errorf("List(prefix %q, after %q, %d) = %q, %v; want %q", c.prefix, c.after, c.limit, got, err, c.want)
				}
			}
		})
	}
}

// hold acquires each of keys on l, every one while the ones before are held,
// and releases them when t ends.
func hold(t *testing.T, l *sqllock.Locker, keys ...string) {
	t.Helper()
	for i, key := range keys {
		lease, err := l.Acquire(context.Background(), key, driver.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Errorf("Acquire(%q) while %q are held: %v", key, keys[:i], err)
			continue
		}
		t.Cleanup(func() { lease.Release(context.Background()) })
	}
}

// TestBadLeaseOptions: an owner label guard would refuse (a NUL byte, which
// PostgreSQL's text cannot store, invalid UTF-8, which MariaDB's cannot
// either, or one longer than driver.MaxOwnerLen) and a TTL that is not
// positive are refused with ErrInvalidOption on every database, taking
// nothing. The labels were reported as the database being unavailable on
// PostgreSQL and MariaDB and stored on SQLite; a TTL of 0 granted a lease
// already expired, and a Refresh with it ended a held lease and reported
// success.
func TestBadLeaseOptions(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			l := newLocker(t, migrated(t, db, db.dsn(t)))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			key := uniqueKey(t)
			for _, o := range []driver.AcquireOptions{
				{TTL: time.Minute, Owner: "a\x00b"},
				{TTL: time.Minute, Owner: "caf\xc3"},
				{TTL: time.Minute, Owner: strings.Repeat("o", driver.MaxOwnerLen+1)},
				{TTL: 0},
				{TTL: -time.Second},
				{TTL: 500 * time.Nanosecond}, // 0 in microseconds
			} {
				if lease, err := l.Acquire(ctx, key, o); !errors.Is(err, driver.ErrInvalidOption) {
					t.Errorf("Acquire with owner %.20q and TTL %v: (%v, %v), want ErrInvalidOption", o.Owner, o.TTL, lease, err)
				}
			}
			lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			for _, ttl := range []time.Duration{0, -time.Second, 500 * time.Nanosecond} {
				if err := lease.Refresh(ctx, ttl); !errors.Is(err, driver.ErrInvalidOption) {
					t.Errorf("Refresh(%v): %v, want ErrInvalidOption", ttl, err)
				}
				if errs := l.RefreshBatch(ctx, []driver.Lease{lease}, ttl); !errors.Is(errs[0], driver.ErrInvalidOption) {
					t.Errorf("RefreshBatch(%v): %v, want ErrInvalidOption", ttl, errs[0])
				}
			}
			if in, err := l.Inspect(ctx, key); err != nil || len(in.Holders) != 1 || in.Holders[0].Token != lease.Token() {
				t.Errorf("Inspect after the refused refreshes: %+v, %v; want the lease still held", in, err)
			}
		})
	}
}
