package sqllock_test

import (
	"testing"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestPing runs on PostgreSQL through a proxy that stops answering.
func TestPing(t *testing.T) {
	db := databases()[1]
	dsn := db.dsn(t)
	cutDSN, p := proxied(t, dsn)
	up, cut := openDB(t, db, dsn), openDB(t, db, cutDSN)
	p.Blackhole()
	t.Run("Locker", func(t *testing.T) { drivertest.CheckPing(t, newLocker(t, up), newLocker(t, cut)) })
	t.Run("Store", func(t *testing.T) {
		s, err := sqllock.NewStore(up)
		if err != nil {
			t.Fatal(err)
		}
		c, err := sqllock.NewStore(cut)
		if err != nil {
			t.Fatal(err)
		}
		drivertest.CheckPing(t, s, c)
	})
}
