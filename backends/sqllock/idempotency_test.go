package sqllock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

// eachStore runs suite on the SQL idempotency store of each database, with
// the table migrated first; newStore opens a client of its own each call.
// The first store is returned to the suite's caller for checks afterwards.
func eachStore(t *testing.T, suite func(t *testing.T, db database, first *sqllock.Store, newStore func(testing.TB) idempotency.Store)) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			open := func(t testing.TB) *sqllock.Store {
				st, err := sqllock.NewStore(openDB(t, db, dsn))
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			first := open(t)
			if err := first.Migrate(context.Background()); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			suite(t, db, first, func(t testing.TB) idempotency.Store { return open(t) })
		})
	}
}

func TestStore(t *testing.T) {
	eachStore(t, func(t *testing.T, db database, first *sqllock.Store, newStore func(testing.TB) idempotency.Store) {
		var opts []storetest.Option
		if db.name == "postgres" {
			opts = append(opts, storetest.Silence(func(t testing.TB) (idempotency.Store, func()) {
				via, p := proxied(t, db.dsn(t))
				st, err := sqllock.NewStore(openDB(t, db, via))
				if err != nil {
					t.Fatal(err)
				}
				return st, p.Blackhole
			}))
		}
		storetest.Run(t, newStore, opts...)
		if _, err := first.Purge(context.Background()); err != nil {
			t.Errorf("Purge: %v", err)
		}
	})
}

// TestIdempotencyMiddleware runs httpmw's behaviour tests, over real HTTP, on
// the SQL store of each database.
func TestIdempotencyMiddleware(t *testing.T) {
	eachStore(t, func(t *testing.T, _ database, _ *sqllock.Store, newStore func(testing.TB) idempotency.Store) {
		httpmwtest.Run(t, newStore)
	})
}

// TestNewStoreNilOption: a nil option is refused with an error naming it,
// not a panic. It needs no database: NewStore is refused before it looks.
func TestNewStoreNilOption(t *testing.T) {
	db := &gorm.DB{Config: &gorm.Config{}}
	st, err := sqllock.NewStore(db, nil)
	if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "nil StoreOption") {
		t.Errorf("NewStore(db, nil): (%v, %v), want ErrInvalidOption naming the nil StoreOption", st, err)
	}
}
