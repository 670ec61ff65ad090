package sqllock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// account is the user's own data that the lock protects.
type account struct {
	ID      string `gorm:"primaryKey;type:varchar(64)"`
	Balance int64
	Writer  uint64
}

func (account) TableName() string { return "warden_test_accounts" }

// TestFence: a holder pauses past its lease, another takes the lock over and
// writes; when the stale holder wakes up, its write is refused while the new
// holder's stands.
func TestFence(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			g := migrated(t, db, dsn)
			if err := g.AutoMigrate(&account{}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			k := uniqueKey(t)
			acct := account{ID: k[len(k)-20:]}
			if err := g.Create(&acct).Error; err != nil {
				t.Fatal(err)
			}
			// write is the user's critical-section write, fenced.
			write := func(l driver.Lease, balance int64) error {
				return g.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					if err := sqllock.Fence(tx, "account/"+acct.ID, l.Token()); err != nil {
						return err
					}
					return tx.Model(&account{}).Where("id = ?", acct.ID).
						Updates(map[string]any{"balance": balance, "writer": l.Token()}).Error
				})
			}

			stale, err := newLocker(t, openDB(t, db, dsn)).Acquire(ctx, k, driver.AcquireOptions{TTL: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := write(stale, 10); err != nil {
				t.Fatalf("write under a live lease: %v", err)
			}
			// The holder pauses; its lease runs out and another takes over.
			fresh, err := newLocker(t, openDB(t, db, dsn)).Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Release(context.Background())
			if err := write(fresh, 20); err != nil {
				t.Fatalf("new holder's write: %v", err)
			}
			if err := write(fresh, 30); err != nil {
				t.Fatalf("new holder's second write with the same token: %v", err)
			}
			err = write(stale, 666)
			if !errors.Is(err, sqllock.ErrStaleToken) || !errors.Is(err, driver.ErrLockLost) {
				t.Fatalf("stale holder's write: got %v, want ErrStaleToken and ErrLockLost", err)
			}
			var got account
			if err := g.First(&got, "id = ?", acct.ID).Error; err != nil {
				t.Fatal(err)
			}
			if got.Balance != 30 || got.Writer != fresh.Token() {
				t.Errorf("account after the stale write: balance %d by token %d, want 30 by %d", got.Balance, got.Writer, fresh.Token())
			}

			if err := sqllock.Fence(g, "account/"+acct.ID, fresh.Token()); !errors.Is(err, driver.ErrInvalidOption) {
				t.Errorf("Fence outside a transaction: got %v, want ErrInvalidOption", err)
			}
		})
	}
}

// TestFenceOddResources: resources that differ by a trailing space, letter
// case or Unicode normalisation are fenced apart on every database (each
// is given a lower token than the one before, refused were it the same
// row); one holding a NUL byte, which PostgreSQL's text cannot store, or
// invalid UTF-8 is refused as an invalid key on all three, not reported as
// the database being unavailable.
func TestFenceOddResources(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			f, err := sqllock.NewFencer(migrated(t, db, db.dsn(t)))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			k := uniqueKey(t)
			for i, r := range []string{k, k + " ", k + "  ", strings.ToUpper(k), k + "é", k + "e\u0301", k + "/", k[:len(k)-1]} {
				if err := f.Advance(ctx, fence.Claim{Resource: r, Token: uint64(100 - i)}); err != nil {
					t.Errorf("resource %q: %v, want its own fence", r, err)
				}
			}
			for _, r := range []string{k + "\x00", "\x00" + k, k + "\xff"} {
				if err := f.Advance(ctx, fence.Claim{Resource: r, Token: 1}); !errors.Is(err, driver.ErrInvalidKey) {
					t.Errorf("resource %q: %v, want ErrInvalidKey", r, err)
				}
			}
		})
	}
}

// TestFenceRowRefusedByAPlugin: on MySQL, Fence reads the fence row back;
// when another plugin's row callback fails that read, Fence returns the
// error. It panicked reading a nil *sql.Row.
func TestFenceRowRefusedByAPlugin(t *testing.T) {
	db := databases()[2]
	g := migrated(t, db, db.dsn(t))
	refused := errors.New("refused by a plugin")
	err := g.Callback().Row().Before("gorm:row").Register("test:refuse", func(tx *gorm.DB) { tx.AddError(refused) })
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Fence panicked: %v", p)
			}
		}()
		err = g.Transaction(func(tx *gorm.DB) error { return sqllock.Fence(tx, uniqueKey(t), 5) })
	}()
	if !errors.Is(err, refused) {
		t.Errorf("Fence with its read refused: %v, want the plugin's error", err)
	}
}
