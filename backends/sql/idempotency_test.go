package sqllock_test

import (
	"context"
	"testing"

	sqllock "github.com/warden-go/warden/backends/sql"
	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

func TestIdempotencyStore(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			st, err := sqllock.NewIdempotencyStore(openDB(t, db, dsn))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Migrate(context.Background()); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			storetest.Run(t, func(t testing.TB) idempotency.Store {
				st, err := sqllock.NewIdempotencyStore(openDB(t, db, dsn))
				if err != nil {
					t.Fatal(err)
				}
				return st
			})
			if _, err := st.Purge(context.Background()); err != nil {
				t.Errorf("Purge: %v", err)
			}
		})
	}
}

// TestIdempotencyMiddleware runs httpmw's behaviour tests, over real HTTP, on
// the SQL store of each database.
func TestIdempotencyMiddleware(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			st, err := sqllock.NewIdempotencyStore(openDB(t, db, dsn))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Migrate(context.Background()); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			httpmwtest.Run(t, func(t testing.TB) idempotency.Store {
				st, err := sqllock.NewIdempotencyStore(openDB(t, db, dsn))
				if err != nil {
					t.Fatal(err)
				}
				return st
			})
		})
	}
}
