package sqllock_test

import (
	"strings"
	"testing"

	"github.com/warden-go/warden/backends/sqllock"
)

// TestClockExact: the expression PostgreSQL's statements read the clock
// with gives the exact microsecond, the same as the numeric extract(epoch
// ...) that tables written by earlier versions were filled from, for any
// instant before 2^32 seconds (2106-02-07), past which it is not.
func TestClockExact(t *testing.T) {
	db := postgresDB()
	g := openDB(t, db, db.dsn(t))
	now := sqllock.Now(newLocker(t, g))
	if !strings.Contains(now, "clock_timestamp()") {
		t.Fatalf("the clock expression %q reads no clock_timestamp()", now)
	}
	at := strings.ReplaceAll(now, "clock_timestamp()", "ts")
	var differ, n int64
	err := g.Raw(`SELECT count(*) FILTER (WHERE `+at+` <> (extract(epoch FROM ts)*1000000)::bigint), count(*) FROM (
		SELECT timestamptz 'epoch' + (random() * (2^32 * 1000000 - 1))::bigint * interval '1 microsecond' AS ts FROM generate_series(1, 200000)
		UNION ALL SELECT timestamptz 'epoch' + (2^32 * 1000000 - i)::bigint * interval '1 microsecond' FROM generate_series(1, 1000) i
		UNION ALL SELECT clock_timestamp() + i * interval '1 microsecond' FROM generate_series(1, 1000) i) s`).Row().Scan(&differ, &n)
	if err != nil {
		t.Fatal(err)
	}
	if differ != 0 || n != 202000 {
		t.Errorf("%d of %d instants read differently from extract(epoch ...), want 0 of 202000", differ, n)
	}
}
