package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestTableNotFit: a lock table that is missing (Migrate never ran), or
// that lacks the package's columns (another table of the same name), is
// reported at the first Acquire with ErrInvalidOption naming the fix, on
// every database, and a waiting Acquire returns it at once rather than
// retry until its deadline as if the database were down. The error names
// the column missing, not waiting_until, which an earlier version's table
// lacks alone. A table whose schema is missing is reported so, naming the
// schema as what may be missing.
func TestTableNotFit(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g := openDB(t, db, db.dsn(t))
			shaped := fmt.Sprintf("shaped_%d", time.Now().UnixNano())
			if err := g.Exec("CREATE TABLE " + shaped + " (name varchar(255) NOT NULL PRIMARY KEY, owner varchar(255) NOT NULL)").Error; err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Exec("DROP TABLE " + shaped) })
			for _, c := range []struct{ table, want string }{
				{fmt.Sprintf("missing_%d", time.Now().UnixNano()), "Migrate"},
				{fmt.Sprintf("no_schema_%d.missing", time.Now().UnixNano()), "the schema it names"},
				{shaped, "version"},
			} {
				l := newLocker(t, g, sqllock.WithTable(c.table))
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, err := l.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute, Wait: true})
				cancel()
				if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "waiting_until") {
					t.Errorf("waiting Acquire on the table %s: %v, want ErrInvalidOption naming %q, not waiting_until", c.table, err, c.want)
				}
			}
		})
	}
}
