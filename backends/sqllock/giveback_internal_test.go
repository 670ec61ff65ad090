package sqllock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/guard/driver"
)

// sqliteCode stands for SQLite drivers' errors, which carry a result code.
type sqliteCode int

func (c sqliteCode) Error() string { return fmt.Sprintf("sqlite error %d", int(c)) }
func (c sqliteCode) Code() int     { return int(c) }

// TestUnanswered: only an error the database answered with says that the
// statement failed; the ctx's end and a broken connection leave it unknown.
func TestUnanswered(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.Canceled, true},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("%w: %w", driver.ErrUnavailable, context.DeadlineExceeded), true},
		{&pgconn.PgError{Code: "40P01"}, false},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "57014"}), false},
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found"}, false},
		{fmt.Errorf("wrapped: %w", sqliteCode(5)), false},
	} {
		if got := unanswered(c.err); got != c.want {
			t.Errorf("unanswered(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestGiveBackIsOwnerChecked: the give-back of an attempt frees the row
// only while that attempt's owner value holds it, and leaves the version,
// so that the next grant's token is past it.
func TestGiveBackIsOwnerChecked(t *testing.T) {
	g, err := gorm.Open(sqlite.Open(filepath.Join(t.TempDir(), "locks.db")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := New(g, WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	opts := driver.AcquireOptions{TTL: time.Minute}
	got, err := l.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatal(err)
	}
	held := got.(*lease)
	giveBack := func(owner string) int64 {
		res, err := l.pool.ExecContext(ctx, l.q.giveBack, "k", owner)
		if err != nil {
			t.Fatal(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Another attempt of the same Locker, and of another Locker.
	for _, other := range []string{l.ownerOf(held.seq+1, ""), "other/1"} {
		if n := giveBack(other); n != 0 {
			t.Fatalf("the give-back of %q freed %d rows held by %q", other, n, held.owner())
		}
	}
	if err := held.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("the holder lost its lock to another's give-back: %v", err)
	}
	if n := giveBack(held.owner()); n != 1 {
		t.Fatalf("the give-back of the holding attempt freed %d rows, want 1", n)
	}
	next, err := l.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("after the give-back: %v", err)
	}
	if next.Token() <= held.Token() {
		t.Fatalf("token %d after %d", next.Token(), held.Token())
	}
	if err := held.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("the given-back lease's release: %v, want ErrNotHeld", err)
	}
}
