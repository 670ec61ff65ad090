package sqllock

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestNoPauseAfterLastAttempt: a statement refused for contention runs
// again after a pause, up to retries runs, and the last run's refusal is
// reported at once, no pause delaying an error that comes anyway.
func TestNoPauseAfterLastAttempt(t *testing.T) {
	for _, err := range []error{
		&pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"},
		&pgconn.PgError{Code: "40P01", Message: "deadlock detected"},
		&mysql.MySQLError{Number: 1213, Message: "Deadlock found"},
	} {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			for attempt := range retries - 1 {
				if !retryable(t.Context(), nil, err, attempt) {
					t.Fatalf("%v at attempt %d of %d: not run again", err, attempt, retries)
				}
			}
			if time.Since(start) == 0 {
				t.Errorf("%v: no pause before the %d reruns", err, retries-1)
			}
			last := time.Now()
			if retryable(t.Context(), nil, err, retries-1) {
				t.Errorf("%v at the last attempt: run again", err)
			}
			if d := time.Since(last); d != 0 {
				t.Errorf("%v at the last attempt: paused %v before giving up", err, d)
			}
		})
	}
}
