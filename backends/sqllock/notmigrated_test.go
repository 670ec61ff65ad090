package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/internal/failopen"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// TestStoreNotMigrated: a Store on an idempotency table never created, or
// in a schema that does not exist, fails every call with an error naming
// the table and Store.Migrate, wrapping idempotency.ErrInvalid and
// driver.ErrInvalidOption, not ErrUnavailable; and httpmw's Idempotency,
// with WithFailOpen or without, answers a keyed request with an error,
// never running its handler unguarded as it does for a store that is down,
// nor answering 503 as if a retry could succeed.
func TestStoreNotMigrated(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g := openDB(t, db, db.dsn(t))
			n := time.Now().UnixNano()
			for _, table := range []string{fmt.Sprintf("never_made_%d", n), fmt.Sprintf("no_schema_%d.never_made", n)} {
				st, err := sqllock.NewStore(g, sqllock.WithStoreTable(table))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, claimErr := st.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute})
				_, getErr := st.Get(ctx, "", "k")
				_, purgeErr := st.Purge(ctx)
				for op, err := range map[string]error{
					"Claim": claimErr, "Get": getErr, "Purge": purgeErr,
					"Extend":   st.Extend(ctx, "", "k", "o", time.Minute),
					"Complete": st.Complete(ctx, "", "k", "o", []byte("r"), time.Minute),
					"Abandon":  st.Abandon(ctx, "", "k", "o"),
					"Delete":   st.Delete(ctx, "", "k", "o"),
				} {
					if !errors.Is(err, idempotency.ErrInvalid) || !errors.Is(err, driver.ErrInvalidOption) || errors.Is(err, idempotency.ErrUnavailable) ||
						!strings.Contains(err.Error(), "Store.Migrate") || !strings.Contains(err.Error(), "never_made") ||
						strings.Contains(table, ".") && !strings.Contains(err.Error(), "schema it names") {
						t.Errorf("%s on the table %s, never created: %v; want ErrInvalid and ErrInvalidOption, not ErrUnavailable, naming the table (and its schema, if it names one) and Store.Migrate", op, table, err)
					}
				}
				cancel()
				for _, failOpen := range []bool{false, true} {
					if status, ran := failopen.Serve(t, st, failOpen); ran != 0 || status != http.StatusInternalServerError {
						t.Errorf("Idempotency (WithFailOpen %v) on the table %s, never created: status %d, handler run %d times; want 500 (not 503, which says retry later), the handler not run",
							failOpen, table, status, ran)
					}
				}
			}
		})
	}
}
