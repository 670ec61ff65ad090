package sqllock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// operatorChanges are drivertest.OperatorChanges on g.
func operatorChanges(t *testing.T, g *gorm.DB, key string) map[string]func(context.Context) error {
	t.Helper()
	st, err := sqllock.NewStore(g)
	if err != nil {
		t.Fatal(err)
	}
	return drivertest.OperatorChanges(newLocker(t, g), st, key)
}

// heldAndClaimed holds a new key and claims its record on g (see
// drivertest.HeldAndClaimed).
func heldAndClaimed(t *testing.T, g *gorm.DB) (string, func() (held, kept bool)) {
	st, err := sqllock.NewStore(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	return key, drivertest.HeldAndClaimed(t, newLocker(t, g), st, key)
}

// readOnly is dsn, of db, for a connection whose writes the database
// refuses: PostgreSQL's and MariaDB's transactions read-only, as a
// replica's are, and an SQLite file opened read-only.
func readOnly(db database, dsn string) string {
	switch db.name {
	case "postgres":
		return dsn + "&default_transaction_read_only=on"
	case "mariadb":
		return dsn + "&tx_read_only=1"
	}
	path, _, _ := strings.Cut(dsn, "?")
	return "file:" + path + "?mode=ro"
}

// TestChangesRefusedMarkedNotSent: a forced release, a record's delete and
// its abandon that the database refused on a read-only connection, or
// that never left (the server gone, its port closed, the pool's
// connection reset), fail matching driver.ErrNotSent, and the lock and the
// record are kept.
func TestChangesRefusedMarkedNotSent(t *testing.T) {
	ctx := context.Background()
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			g := migrated(t, db, dsn)
			cases := map[string]func(t *testing.T) *gorm.DB{
				"read-only": func(t *testing.T) *gorm.DB { return openDB(t, db, readOnly(db, dsn)) },
			}
			if db.name != "sqlite" {
				cases["server down"] = func(t *testing.T) *gorm.DB {
					p := drivertest.StartProxy(t, hostOf(dsn))
					via := openDB(t, db, strings.Replace(dsn, hostOf(dsn), p.Addr(), 1))
					if err := via.Exec("SELECT 1").Error; err != nil { // a connection in the pool
						t.Fatal(err)
					}
					p.Down()
					return via
				}
			}
			for name, open := range cases {
				t.Run(name, func(t *testing.T) {
					key, still := heldAndClaimed(t, g)
					drivertest.WantNotSent(t, ctx, operatorChanges(t, open(t), key))
					if held, kept := still(); !held || !kept {
						t.Errorf("after the refused changes: held %v, kept %v; want both", held, kept)
					}
				})
			}
		})
	}
}

// TestChangesUnansweredNotMarked: a change whose answer is lost after the
// database ran it (its answer held back by the proxy, the connection then
// reset) fails without driver.ErrNotSent.
func TestChangesUnansweredNotMarked(t *testing.T) {
	ctx := context.Background()
	for _, db := range databases()[1:] {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			g := migrated(t, db, dsn)
			p := drivertest.StartProxy(t, hostOf(dsn))
			via := openDB(t, db, strings.Replace(dsn, hostOf(dsn), p.Addr(), 1))
			for _, change := range []string{"ForceRelease", "Delete", "DeleteOwned", "Abandon"} {
				t.Run(change, func(t *testing.T) {
					p.Reset()
					key, still := heldAndClaimed(t, g)
					f := operatorChanges(t, via, key)[change]
					if err := via.Exec("SELECT 1").Error; err != nil { // a connection in the pool
						t.Fatal(err)
					}
					// Held back long enough for the reads and prepares
					// before the change, each answered late.
					drivertest.WantAnswerLostUnmarked(t, p, 3*time.Second, func() error { return f(ctx) }, func() bool {
						held, kept := still()
						return change == "ForceRelease" && !held || change != "ForceRelease" && !kept
					})
				})
			}
		})
	}
}
